"""Ingest and search speed of the LanceDB store at a given size, beside LanceDB's own hybrid.

Vectors are precomputed (random unit vectors, 384-d) so the numbers measure the
store and the retriever, not the embedder. Text comes from the man-page corpus,
cycled to the requested size. Both searches run on the same table in the same run:
ours (vector kNN + BM25 fused by our weighted RRF, hydrated into SearchResults)
and LanceDB's `query_type="hybrid"` (its RRF reranker), so the ratio is fair.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from common import FixedQueries
from corpus import KnownItem

from haiku.rag.config import SearchConfig
from haiku.rag.documents import Chunk, Document, chunk_id_for
from haiku.rag.retrieval.hybrid import HybridRetriever
from haiku.rag.store.base import StoreSettings
from haiku.rag.store.lancedb import LanceDBStore

DIM = 384
CHUNKS_PER_DOCUMENT = 10
WRITE_GROUP = 640  # chunks per Store.write, as ingest writes 64 documents at a time


@dataclass(frozen=True)
class SpeedReport:
    chunks: int
    ingest_chunks_per_s: float
    optimize_s: float
    ours_p50_ms: float
    ours_p95_ms: float
    lance_p50_ms: float
    lance_p95_ms: float


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _synthetic(items: Sequence[KnownItem], n_chunks: int) -> list[tuple[Document, list[Chunk]]]:
    paragraphs = [p for item in items for p in item.document.split("\n\n") if len(p) > 80]
    out = []
    for d in range(n_chunks // CHUNKS_PER_DOCUMENT):
        texts = [
            paragraphs[(d * CHUNKS_PER_DOCUMENT + i) % len(paragraphs)][:1000]
            for i in range(CHUNKS_PER_DOCUMENT)
        ]
        document = Document.from_text("\n\n".join(texts), uri=f"bench://doc/{d}")
        chunks = [
            Chunk(id=chunk_id_for(document.id, i, t), document_id=document.id, order=i, content=t)
            for i, t in enumerate(texts)
        ]
        out.append((document, chunks))
    return out


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1000, p95 * 1000


async def run_speed(
    items: Sequence[KnownItem], n_chunks: int, queries: int = 50, seed: int = 3
) -> SpeedReport:
    rng = np.random.default_rng(seed)
    data = _synthetic(items, n_chunks)
    total = sum(len(chunks) for _, chunks in data)
    vectors = _unit(rng, total)
    with tempfile.TemporaryDirectory() as tmp:
        settings = StoreSettings(
            driver="lancedb", embedding_model="bench", embedding_dim=DIM,
            chunk_size=1000, chunk_overlap=0,
        )  # fmt: skip
        store = LanceDBStore.create(str(Path(tmp) / "speed.lancedb"), settings)
        started = time.perf_counter()
        row = 0
        group = WRITE_GROUP // CHUNKS_PER_DOCUMENT
        for start in range(0, len(data), group):
            batch = data[start : start + group]
            chunks = [chunk for _, doc_chunks in batch for chunk in doc_chunks]
            store.write([doc for doc, _ in batch], chunks, vectors[row : row + len(chunks)])
            row += len(chunks)
        ingest_s = time.perf_counter() - started
        started = time.perf_counter()
        store.optimize()
        optimize_s = time.perf_counter() - started

        texts = [item.query for item in items[:queries]]
        query_vectors = {
            text: vector for text, vector in zip(texts, _unit(rng, len(texts)), strict=True)
        }
        retriever = HybridRetriever(store, FixedQueries(query_vectors), SearchConfig())
        table = store._table("chunks")

        ours, lance = [], []
        for text in texts:  # warm both paths once
            await retriever.search(text, top_k=10)
            table.search(query_type="hybrid").vector(query_vectors[text]).text(text).limit(
                10
            ).to_list()
            break
        for text in texts:
            started = time.perf_counter()
            await retriever.search(text, top_k=10)
            ours.append(time.perf_counter() - started)
            started = time.perf_counter()
            (
                table.search(query_type="hybrid", fts_columns="content")
                .vector(query_vectors[text])
                .text(text)
                .limit(10)
                .to_list()
            )
            lance.append(time.perf_counter() - started)
        store.close()
    ours_p50, ours_p95 = _percentiles(ours)
    lance_p50, lance_p95 = _percentiles(lance)
    return SpeedReport(
        chunks=total,
        ingest_chunks_per_s=total / ingest_s,
        optimize_s=optimize_s,
        ours_p50_ms=ours_p50,
        ours_p95_ms=ours_p95,
        lance_p50_ms=lance_p50,
        lance_p95_ms=lance_p95,
    )


if __name__ == "__main__":  # pragma: no cover
    from corpus import man_pages

    print(asyncio.run(run_speed(man_pages(100), 10_000)))
