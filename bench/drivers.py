"""Storage drivers side by side: ingest speed, open time and search latency per size.

    python bench/drivers.py                        # 10k and 100k chunks, every driver
    python bench/drivers.py --sizes 10000          # quicker
    python bench/drivers.py --drivers yaml,lancedb --queries 50
    python bench/drivers.py --vectors              # exact numpy vs HNSW for _vectors.py

Every writable driver that imports is measured on the same data in one run: chunks of
~450 characters of synthetic English-like text, 10 per document, 384-dimensional random
unit vectors (precomputed, so the embedder is not measured). Ingest writes 640 chunks
per `Store.write` (64 documents, as `HaikuRAG.add` does), then runs what `add` runs
after writing (`optimize()` where the driver has it) and closes the store, so the
number is the cost of an add from nothing. Then, on a fresh process-level open:

- open: `open(read_only=True)`, best of 3 (the yaml driver parses the whole file here);
- first search: the first hybrid query after opening (lazy indexes are built here);
- p50: hybrid (vector + BM25 fused by weighted RRF, hydrated into SearchResults),
  vector only and BM25 only, over `--queries` queries after the first.

The machine is shared and noisy: compare drivers within one run, not across runs.
The default run (10k and 100k) takes ~9 minutes on the 2-core machine, almost all of
it ingesting 100k chunks into lancedb (~160 s) and duckdb (~220 s); `--sizes 10k`
takes ~30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from common import FixedQueries

from haiku.rag.config import SearchConfig
from haiku.rag.documents import Chunk, Document, chunk_id_for
from haiku.rag.retrieval.hybrid import HybridRetriever
from haiku.rag.store import DRIVERS, driver_class
from haiku.rag.store._vectors import VectorIndex
from haiku.rag.store.base import StoreSettings

DIM = 384
CHUNKS_PER_DOCUMENT = 10
WRITE_GROUP_DOCUMENTS = 64
WRITABLE = ("lancedb", "yaml", "duckdb")
SUFFIX = {"lancedb": ".lancedb", "yaml": ".yaml", "duckdb": ".duckdb"}
VOCABULARY_SIZE = 4000


@dataclass(frozen=True)
class Corpus:
    documents: list[Document]
    chunks: list[list[Chunk]]
    vectors: np.ndarray
    queries: dict[str, np.ndarray]


@dataclass(frozen=True)
class Row:
    chunks: int
    driver: str
    ingest_s: float
    open_s: float
    first_search_s: float
    hybrid_p50_ms: float
    vector_p50_ms: float
    bm25_p50_ms: float
    disk_mb: float

    @property
    def ingest_rate(self) -> float:
        return self.chunks / self.ingest_s


def _words(rng: np.random.Generator) -> np.ndarray:
    """A vocabulary of pronounceable made-up words, drawn with Zipf-like frequencies."""
    consonants, vowels = list("bcdfghklmnprstvz"), list("aeiou")
    words = set()
    while len(words) < VOCABULARY_SIZE:
        length = int(rng.integers(2, 5))
        words.add("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(length)))
    return np.array(sorted(words))


def make_corpus(n_chunks: int, queries: int, seed: int = 5) -> Corpus:
    rng = np.random.default_rng(seed)
    vocabulary = _words(rng)
    weights = 1.0 / np.arange(1, len(vocabulary) + 1)
    weights /= weights.sum()
    drawn = rng.choice(len(vocabulary), size=(n_chunks, 70), p=weights)
    texts = [" ".join(vocabulary[row]) + "." for row in drawn]
    documents, chunks = [], []
    for d in range(n_chunks // CHUNKS_PER_DOCUMENT):
        parts = texts[d * CHUNKS_PER_DOCUMENT : (d + 1) * CHUNKS_PER_DOCUMENT]
        document = Document.from_text("\n\n".join(parts), uri=f"bench://doc/{d}.md")
        start, doc_chunks = 0, []
        for i, text in enumerate(parts):
            chunk_id = chunk_id_for(document.id, i, text)
            doc_chunks.append(
                Chunk(id=chunk_id, document_id=document.id, order=i, content=text, start=start)
            )
            start += len(text) + 2
        documents.append(document)
        chunks.append(doc_chunks)
    vectors = rng.standard_normal((len(texts), DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    query_texts = [" ".join(vocabulary[rng.integers(0, 400, size=3)]) for _ in range(queries + 1)]
    query_vectors = rng.standard_normal((len(query_texts), DIM)).astype(np.float32)
    query_vectors /= np.linalg.norm(query_vectors, axis=1, keepdims=True)
    return Corpus(documents, chunks, vectors, dict(zip(query_texts, query_vectors, strict=True)))


def available(names: Sequence[str]) -> list[str]:
    out = []
    for name in names:
        spec = DRIVERS.get(name)
        if spec and importlib.util.find_spec(spec.partition(":")[0]) is not None:
            out.append(name)
        else:
            print(f"(skipping {name}: driver not available)", file=sys.stderr)
    return out


def _disk_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    siblings = [p for p in path.parent.iterdir() if p != path and p.is_file()]
    return sum(p.stat().st_size for p in files + siblings) / 1e6


def ingest(driver: str, path: Path, corpus: Corpus) -> float:
    settings = StoreSettings(
        driver=driver, embedding_model="bench:random", embedding_dim=DIM, chunk_size=1000,
        chunk_overlap=0,
    )  # fmt: skip
    started = time.perf_counter()
    store = driver_class(driver).create(str(path), settings)
    row = 0
    for start in range(0, len(corpus.documents), WRITE_GROUP_DOCUMENTS):
        documents = corpus.documents[start : start + WRITE_GROUP_DOCUMENTS]
        chunks = [c for group in corpus.chunks[start : start + len(documents)] for c in group]
        store.write(documents, chunks, corpus.vectors[row : row + len(chunks)])
        row += len(chunks)
    optimize: Callable[[], object] | None = getattr(store, "optimize", None)
    if optimize is not None:
        optimize()
    store.close()
    return time.perf_counter() - started


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


async def measure(driver: str, path: Path, corpus: Corpus, ingest_s: float) -> Row:
    cls = driver_class(driver)
    opens = []
    for _ in range(3):
        gc.collect()
        started = time.perf_counter()
        store = cls.open(str(path), read_only=True)
        opens.append(time.perf_counter() - started)
        store.close()
        del store
    gc.collect()
    store = cls.open(str(path), read_only=True)
    try:
        retriever = HybridRetriever(store, FixedQueries(corpus.queries), SearchConfig())
        texts = list(corpus.queries)
        started = time.perf_counter()
        await retriever.search(texts[0], top_k=10)
        first = time.perf_counter() - started
        p50 = {}
        for name, signals in (("hybrid", None), ("vector", {"vector"}), ("bm25", {"bm25"})):
            samples = []
            for text in texts[1:]:
                started = time.perf_counter()
                await retriever.search(text, top_k=10, signals=signals)
                samples.append(time.perf_counter() - started)
            p50[name] = statistics.median(samples) * 1000
    finally:
        store.close()
    return Row(
        chunks=len(corpus.vectors),
        driver=driver,
        ingest_s=ingest_s,
        open_s=min(opens),
        first_search_s=first,
        hybrid_p50_ms=p50["hybrid"],
        vector_p50_ms=p50["vector"],
        bm25_p50_ms=p50["bm25"],
        disk_mb=_disk_mb(path),
    )


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"
        return f"{value:,}" if isinstance(value, int) else str(value)

    cells = [list(header)] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [f"\n{title}", ""]
    for i, row in enumerate(cells):
        lines.append("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            lines.append("|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    return "\n".join(lines)


async def run_drivers(sizes: Sequence[int], drivers: Sequence[str], queries: int) -> str:
    rows: list[Row] = []
    for size in sizes:
        corpus = make_corpus(size, queries)
        for driver in drivers:
            root = Path(tempfile.mkdtemp(prefix=f"bench-{driver}-"))
            try:
                path = root / f"kb{SUFFIX[driver]}"
                ingest_s = ingest(driver, path, corpus)
                row = await measure(driver, path, corpus, ingest_s)
                rows.append(row)
                print(
                    f"{size:>7,} {driver:<8} ingest {row.ingest_s:6.1f} s  open {row.open_s:5.2f} s"
                    f"  first {row.first_search_s:5.2f} s  hybrid p50 {row.hybrid_p50_ms:6.1f} ms",
                    file=sys.stderr,
                    flush=True,
                )
            finally:
                shutil.rmtree(root, ignore_errors=True)
    return table(
        f"Drivers, {DIM}-d vectors, {queries} queries (hybrid = vector + BM25, RRF, top 10)",
        (
            "chunks", "driver", "ingest chunks/s", "ingest s", "open s", "first search s",
            "hybrid p50 ms", "vector p50 ms", "bm25 p50 ms", "disk MB",
        ),
        [
            (
                r.chunks, r.driver, r.ingest_rate, r.ingest_s, r.open_s, r.first_search_s,
                r.hybrid_p50_ms, r.vector_p50_ms, r.bm25_p50_ms, r.disk_mb,
            )
            for r in rows
        ],
    )  # fmt: skip


def _unit_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    rows = rng.standard_normal((n, DIM)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _noise(rng: np.random.Generator, n: int, norm: float) -> np.ndarray:
    """Random offsets of about `norm` in length (vectors themselves have length 1)."""
    return norm * rng.standard_normal((n, DIM)).astype(np.float32) / np.sqrt(DIM)


def _run_queries(index: VectorIndex, probe: np.ndarray, k: int) -> float:
    started = time.perf_counter()
    for query in probe:
        index.search(query, k)
    return time.perf_counter() - started


def run_vectors(sizes: Sequence[int], queries: int = 50, k: int = 10) -> str:
    """Exact numpy search vs hnswlib HNSW, as `_vectors.VectorIndex` runs them."""
    rng = np.random.default_rng(9)
    rows = []
    for n in sizes:
        # Clustered data (100 points per cluster) is closer to real embeddings than
        # uniform noise, on which no ANN index does well.
        centers = _unit_rows(rng, max(10, n // 100))
        matrix = centers[rng.integers(0, len(centers), n)] + _noise(rng, n, 0.6)
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
        probe = matrix[rng.integers(0, n, queries)] + _noise(rng, queries, 0.4)
        probe /= np.linalg.norm(probe, axis=1, keepdims=True)
        ids = [f"{i:08d}" for i in range(n)]
        groups = ["g"] * n
        exact = VectorIndex(ids, groups, matrix, hnsw_min_rows=10**12)
        hnsw = VectorIndex(ids, groups, matrix, hnsw_min_rows=0, hnsw_after_queries=0)
        exact.search(probe[0], k)
        exact_s = min(_run_queries(exact, probe, k) for _ in range(2))
        build_s = _timed(hnsw.build_hnsw)
        hnsw_s = min(_run_queries(hnsw, probe, k) for _ in range(2))
        recall = statistics.mean(
            len({c for c, _ in hnsw.search(q, k)} & {c for c, _ in exact.search(q, k)}) / k
            for q in probe
        )
        per_exact, per_hnsw = exact_s / queries, hnsw_s / queries
        breakeven = build_s / (per_exact - per_hnsw) if per_exact > per_hnsw else float("inf")
        rows.append((n, per_exact * 1000, per_hnsw * 1000, build_s, recall, breakeven))
        print(f"{n:>7,} vectors measured", file=sys.stderr, flush=True)
    return table(
        f"_vectors: exact vs HNSW, {DIM}-d, top {k}, {queries} queries "
        "(HNSW re-scored exactly; recall vs exact)",
        ("rows", "exact ms/query", "HNSW ms/query", "HNSW build s", "recall@10",
         "queries to repay build"),
        rows,
    )  # fmt: skip


def _sizes(text: str) -> list[int]:
    return [int(part.replace("_", "").replace("k", "000")) for part in text.split(",") if part]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="chunk counts, e.g. 10k,100k")
    parser.add_argument("--drivers", default=",".join(WRITABLE))
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument(
        "--vectors", action="store_true", help="measure exact vs HNSW (for _vectors.py) instead"
    )
    parser.add_argument("--vector-sizes", default="1000,5000,10000,20000,50000")
    args = parser.parse_args(argv)
    if args.vectors:
        print(run_vectors(_sizes(args.vector_sizes)))
        return
    drivers = available([d.strip() for d in args.drivers.split(",") if d.strip()])
    with contextlib.suppress(KeyboardInterrupt):
        print(asyncio.run(run_drivers(_sizes(args.sizes), drivers, args.queries)))


if __name__ == "__main__":
    main()
