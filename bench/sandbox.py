"""Sandbox round-trip overhead: what one `execute_code` call costs before any real work.

Run: `python bench/sandbox.py` (about ten seconds). Prints one table in milliseconds.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from haiku.rag.config import SandboxConfig
from haiku.rag.documents import Chunk, Document, SearchResult
from haiku.rag.sandbox import MountedDocument, Sandbox, run_once

WARM_CALLS = 200
COLD_STARTS = 5


def _corpus(count: int = 20, size: int = 10_000) -> list[MountedDocument]:
    mounted = []
    for i in range(count):
        doc = Document.from_text("lorem ipsum " * (size // 12), uri=f"file:///bench/{i}.txt")
        chunk = Chunk(id=f"{doc.id}-0", document_id=doc.id, order=0, content=doc.content[:2000])
        mounted.append(MountedDocument(document=doc, chunks=[chunk]))
    return mounted


DOCS = _corpus()
CONFIG = SandboxConfig(code_timeout=10.0, max_output_chars=8000)


async def _search(query: str, top_k: int | None) -> list[SearchResult]:
    chunk, doc = DOCS[0].chunks[0], DOCS[0].document
    return [
        SearchResult(
            chunk_id=chunk.id,
            document_id=doc.id,
            document_uri=doc.uri,
            content=chunk.content,
            score=1.0,
            rank=1,
        )
    ]


async def _timed(action: Callable[[], Awaitable[object]], times: int) -> list[float]:
    samples = []
    for _ in range(times):
        start = time.perf_counter()
        await action()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


async def _cold_start() -> float:
    start = time.perf_counter()
    async with Sandbox(DOCS, _search, CONFIG) as box:
        result = await box.run("1+1")
        elapsed = (time.perf_counter() - start) * 1000
    assert result.output == "2", result
    return elapsed


async def main() -> None:
    rows: list[tuple[str, list[float]]] = []
    rows.append(
        ("cold start: Sandbox() + run('1+1')", [await _cold_start() for _ in range(COLD_STARTS)])
    )
    rows.append(
        (
            "run_once('1+1') (MCP: fresh interpreter)",
            await _timed(lambda: run_once(DOCS, _search, CONFIG, "1+1"), COLD_STARTS),
        )
    )
    doc_id = DOCS[0].document.id
    async with Sandbox(DOCS, _search, CONFIG) as box:
        await box.run("1+1")
        rows.append(("warm run('1+1')", await _timed(lambda: box.run("1+1"), WARM_CALLS)))
        rows.append(("warm print('x')", await _timed(lambda: box.run("print('x')"), WARM_CALLS)))
        read = f"len(open('{doc_id}/content.txt').read())"
        rows.append(
            ("warm read content.txt (10 kB)", await _timed(lambda: box.run(read), WARM_CALLS))
        )
        read_all = "import os\nsum(len(open(d + '/content.txt').read()) for d in os.listdir('.'))"
        rows.append(
            (f"warm read all {len(DOCS)} documents", await _timed(lambda: box.run(read_all), 50))
        )
        rows.append(
            (
                "warm await search('x')",
                await _timed(lambda: box.run("await search('x')"), WARM_CALLS),
            )
        )
    quick = SandboxConfig(code_timeout=0.2, max_output_chars=8000)
    async with Sandbox(DOCS, _search, quick) as box:
        restarts = []
        for _ in range(COLD_STARTS):
            await box.run("while True:\n    pass")
            start = time.perf_counter()
            result = await box.run("1+1")
            restarts.append((time.perf_counter() - start) * 1000)
            assert result.restarted, result
        rows.append(("first run after a timeout (new worker)", restarts))

    width = max(len(name) for name, _ in rows)
    print(f"{'sandbox call':<{width}}  {'n':>4}  {'median':>8}  {'mean':>8}  {'p95':>8}  (ms)")
    for name, samples in rows:
        ordered = sorted(samples)
        p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
        print(
            f"{name:<{width}}  {len(samples):>4}  {statistics.median(samples):>8.2f}  "
            f"{statistics.fmean(samples):>8.2f}  {p95:>8.2f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
