"""Retrieval quality: nDCG@10, Recall@10 and MRR@10 of vector, BM25 and hybrid search.

The known-item set comes from the machine's man pages (bench/corpus.py): each query
has exactly one relevant document. Chunk hits are collapsed to documents (a
document ranks where its best chunk ranks) before scoring.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corpus import KnownItem

from haiku.rag import HaikuRAG
from haiku.rag.config import AppConfig, config_from_dict
from haiku.rag.documents import SearchResult

K = 10
MODES: dict[str, set[str] | None] = {"vector": {"vector"}, "bm25": {"bm25"}, "hybrid": None}


@dataclass(frozen=True)
class Scores:
    ndcg: float
    recall: float
    mrr: float


def document_ranking(results: Sequence[SearchResult], k: int = K) -> list[str]:
    ranking: list[str] = []
    for result in results:
        if result.document_uri not in ranking:
            ranking.append(result.document_uri)
        if len(ranking) == k:
            break
    return ranking


def score(rankings: Sequence[list[str]], relevant: Sequence[str], k: int = K) -> Scores:
    """Known-item metrics: one relevant document per query, so IDCG = 1."""
    ndcg = recall = mrr = 0.0
    for ranking, target in zip(rankings, relevant, strict=True):
        if target in ranking[:k]:
            position = ranking.index(target) + 1
            ndcg += 1 / math.log2(position + 1)
            recall += 1
            mrr += 1 / position
    n = len(relevant) or 1
    return Scores(ndcg / n, recall / n, mrr / n)


@dataclass(frozen=True)
class QualityReport:
    scores: dict[str, Scores]
    documents: int
    chunks: int
    ingest_seconds: float
    readd_seconds: float
    readd_embedded: int
    embedding_model: str


async def run_quality(
    items: Sequence[KnownItem], embedding_model: str, workdir: Path | None = None
) -> QualityReport:
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        folder = Path(tmp) / "pages"
        folder.mkdir()
        for item in items:
            (folder / f"{item.name}.txt").write_text(item.document, encoding="utf-8")
        config: AppConfig = config_from_dict({"embeddings": {"model": embedding_model}})
        async with HaikuRAG(Path(tmp) / "kb.lancedb", config, create=True) as kb:
            started = time.perf_counter()
            await kb.add(str(folder))
            ingest_seconds = time.perf_counter() - started
            started = time.perf_counter()
            readd = await kb.add(str(folder))
            readd_seconds = time.perf_counter() - started
            info = await kb.info()
            relevant = [(folder / f"{item.name}.txt").resolve().as_uri() for item in items]
            scores = {}
            for mode, signals in MODES.items():
                rankings = []
                for item in items:
                    results = await kb.retriever.search(item.query, top_k=50, signals=signals)
                    rankings.append(document_ranking(results))
                scores[mode] = score(rankings, relevant)
    return QualityReport(
        scores=scores,
        documents=info.documents,
        chunks=info.chunks,
        ingest_seconds=ingest_seconds,
        readd_seconds=readd_seconds,
        readd_embedded=readd.chunks_embedded,
        embedding_model=info.embedding_model,
    )
