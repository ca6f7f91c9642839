"""Run the benchmarks and print their tables: `python bench/run.py [SUITE ...] [--quick]`.

Suites: quality (nDCG/Recall/MRR of vector, BM25, hybrid on man pages), speed
(ingest and search latency at 10k and 100k chunks beside LanceDB's own hybrid),
embedders (texts/s of each local embedder), drivers (open/search/ingest per
storage driver), sandbox (execute_code round trips), capability (per-request
overhead of the RAG capability), graph (multi-hop retrieval with the graph signal).
Numbers from one run are comparable with each other; across runs this shared
machine is noisy, so compare ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import table
from corpus import man_pages
from quality import run_quality
from speed import run_speed


async def quality_suite(quick: bool) -> str:
    items = man_pages(100 if quick else 300)
    out = []
    for model in ("local:all-MiniLM-L6-v2", "hash:v1"):
        report = await run_quality(items, model)
        rows = [(mode, s.ndcg, s.recall, s.mrr) for mode, s in report.scores.items()]
        out.append(
            table(
                f"Retrieval quality, {len(items)} man pages ({report.chunks} chunks), "
                f"embedder {report.embedding_model}",
                ("signals", "nDCG@10", "Recall@10", "MRR@10"),
                rows,
            )
        )
        ingest_rows = [
            ("add (end to end)", report.ingest_seconds,
             report.documents / report.ingest_seconds, report.chunks),
            ("re-add unchanged", report.readd_seconds,
             report.documents / report.readd_seconds, report.readd_embedded),
        ]  # fmt: skip
        out.append(
            table(
                f"Ingest with {report.embedding_model}",
                ("phase", "seconds", "docs/s", "chunks embedded"),
                ingest_rows,
            )
        )
    return "\n".join(out)


async def speed_suite(quick: bool) -> str:
    items = man_pages(100)
    rows = []
    for size in (10_000,) if quick else (10_000, 100_000):
        r = await run_speed(items, size)
        row = (f"{r.chunks:,}", r.ingest_chunks_per_s, r.optimize_s,
               r.ours_p50_ms, r.ours_p95_ms, r.lance_p50_ms, r.lance_p95_ms,
               f"{r.ours_p50_ms / r.lance_p50_ms:.2f}x")  # fmt: skip
        rows.append(row)
    header = ("chunks", "ingest chunks/s", "optimize s", "ours p50 ms", "ours p95 ms",
              "lancedb hybrid p50 ms", "lancedb hybrid p95 ms", "ours/lancedb p50")  # fmt: skip
    return table(
        "LanceDB store speed (precomputed 384-d vectors; search top 10, 50 queries)", header, rows
    )


def script_suite(script: str, *quick_args: str) -> Callable[[bool], object]:
    """A benchmark that lives in its own script: run it and relay its table."""

    async def run(quick: bool) -> str:
        args = [sys.executable, str(Path(__file__).parent / script)]
        if quick:
            args.extend(quick_args)
        process = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
        stdout, _ = await process.communicate()
        if process.returncode:
            raise SystemExit(f"{script} failed with exit code {process.returncode}")
        return stdout.decode()

    return run


SUITES: dict[str, Callable[[bool], object]] = {
    "quality": quality_suite,
    "speed": speed_suite,
    "embedders": script_suite("embedders.py"),
    "drivers": script_suite("drivers.py"),
    "sandbox": script_suite("sandbox.py"),
    "capability": script_suite("capability.py"),
    "graph": script_suite("graph.py", "--quick"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("suites", nargs="*", help=f"any of {', '.join(SUITES)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="smaller sets, for a smoke run")
    args = parser.parse_args()
    unknown = set(args.suites) - set(SUITES)
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(sorted(unknown))}; known: {', '.join(SUITES)}")
    for name in args.suites or list(SUITES):
        started = time.perf_counter()
        print(asyncio.run(SUITES[name](args.quick)))  # type: ignore[arg-type]
        print(f"\n({name}: {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
