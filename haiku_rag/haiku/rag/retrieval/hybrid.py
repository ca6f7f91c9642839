"""Hybrid search: run the signals concurrently, fuse with weighted RRF (or rerank), hydrate.

The retriever talks to the store only through the Store protocol and to the
embedder only through `embed_query`, so it works the same on every driver.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from typing import Protocol

import numpy as np

from haiku.rag.config import SearchConfig
from haiku.rag.documents import Document, SearchResult
from haiku.rag.retrieval.fusion import FusedHit, weighted_rrf
from haiku.rag.retrieval.rerank import Reranker
from haiku.rag.retrieval.signals import Query, Signal, default_signals
from haiku.rag.store.base import Store

logger = logging.getLogger(__name__)

GRAPH_SIGNAL = "graph"


class QueryEmbedder(Protocol):
    async def embed_query(self, text: str) -> np.ndarray: ...


class HybridRetriever:
    """Query -> ranked, hydrated `SearchResult`s over one store."""

    def __init__(
        self,
        store: Store,
        embedder: QueryEmbedder,
        search_config: SearchConfig,
        signals: list[Signal] | None = None,
        reranker: Reranker | None = None,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.config = search_config
        self.signals = default_signals(store) if signals is None else list(signals)
        names = [signal.name for signal in self.signals]
        if len(set(names)) != len(names):
            raise ValueError(f"Signal names must be unique, got {names}")
        self.reranker = reranker

    @property
    def signal_names(self) -> list[str]:
        return [signal.name for signal in self.signals]

    def weight(self, signal: str) -> float:
        """The configured RRF weight; a signal the config does not know weighs 1.0."""
        weights = {
            "vector": self.config.vector_weight,
            "bm25": self.config.bm25_weight,
            GRAPH_SIGNAL: self.config.graph_weight,
        }
        return weights.get(signal, 1.0)

    async def search(
        self,
        query: str,
        top_k: int | None = None,
        document_ids: Collection[str] | None = None,
        signals: Collection[str] | None = None,
    ) -> list[SearchResult]:
        """The `top_k` best chunks for `query`, optionally within `document_ids` and using
        only the named `signals` (e.g. {"bm25"} to measure one signal alone)."""
        limit = self.config.top_k if top_k is None else top_k
        if limit <= 0:
            raise ValueError(f"top_k must be positive, got {limit}")
        text = query.strip()
        ids = None if document_ids is None else list(document_ids)
        active = self._active(signals)
        if not text or not active or ids == []:
            return []

        needs_vector = any(getattr(signal, "needs_vector", True) for signal in active)
        vector = await self.embedder.embed_query(text) if needs_vector else None
        request = Query(text=text, vector=vector)
        depth = self.config.candidates if self.reranker is None else self.config.rerank_candidates
        candidates = max(depth, limit)
        rankings = await asyncio.gather(
            *(signal.rank(request, candidates, ids) for signal in active)
        )
        fused = weighted_rrf(
            {signal.name: ranking for signal, ranking in zip(active, rankings, strict=True)},
            {signal.name: self.weight(signal.name) for signal in active},
            k=self.config.rrf_k,
        )
        hydrator = _Hydrator(self.store)
        if self.reranker is None:
            return await hydrator.first(fused, limit)
        pool = await hydrator.all(fused)
        return await self._rerank(text, pool, limit)

    def _active(self, requested: Collection[str] | None) -> list[Signal]:
        """The signals to run: those requested, minus graph under a reranker, minus
        zero-weight ones under RRF (they could only add noise at score 0)."""
        if requested is not None:
            unknown = sorted(set(requested) - set(self.signal_names))
            if unknown:
                raise ValueError(
                    f"Unknown signal(s) {', '.join(unknown)}; "
                    f"available: {', '.join(self.signal_names)}"
                )
        active = [s for s in self.signals if requested is None or s.name in requested]
        if self.reranker is not None:
            return [s for s in active if s.name != GRAPH_SIGNAL]
        return [s for s in active if self.weight(s.name) > 0]

    async def _rerank(self, query: str, pool: list[SearchResult], limit: int) -> list[SearchResult]:
        """Reranker order when it works; the RRF order, with a warning, when it fails."""
        if not pool:
            return []
        assert self.reranker is not None
        try:
            scored = await self.reranker.rerank(query, pool)
        except Exception as error:
            logger.warning(
                "Reranker failed (%s: %s); falling back to RRF order",
                type(error).__name__,
                error,
            )
            return pool[:limit]
        by_id = {result.chunk_id: result for result in pool}
        results: list[SearchResult] = []
        for chunk_id, score in scored:
            result = by_id.pop(chunk_id, None)
            if result is None:
                continue  # unknown or repeated id
            results.append(
                result.model_copy(update={"score": float(score), "rank": len(results) + 1})
            )
            if len(results) == limit:
                break
        if not results:
            logger.warning("Reranker returned none of the candidates; falling back to RRF order")
            return pool[:limit]
        return results


class _Hydrator:
    """Turns fused hits into SearchResults; documents are fetched once per search."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.documents: dict[str, Document | None] = {}

    async def first(self, fused: Sequence[FusedHit], limit: int) -> list[SearchResult]:
        """The first `limit` hits that still exist, fetching `limit` at a time (a chunk can
        vanish between ranking and hydration, or belong to a half-written document)."""
        results: list[SearchResult] = []
        for start in range(0, len(fused), limit):
            wanted = limit - len(results)
            results.extend(
                (await self._hydrate(fused[start : start + limit], len(results)))[:wanted]
            )
            if len(results) == limit:
                break
        return results

    async def all(self, fused: Sequence[FusedHit]) -> list[SearchResult]:
        return await self._hydrate(fused, 0)

    async def _hydrate(self, hits: Sequence[FusedHit], ranked: int) -> list[SearchResult]:
        chunks = await asyncio.to_thread(self.store.get_chunks, [hit.chunk_id for hit in hits])
        by_id = {chunk.id: chunk for chunk in chunks}
        missing = sorted({chunk.document_id for chunk in chunks} - self.documents.keys())
        if missing:
            fetched = await asyncio.to_thread(self.store.get_documents, missing)
            self.documents.update(dict.fromkeys(missing))  # vanished ones stay None
            self.documents.update((document.id, document) for document in fetched)
        results: list[SearchResult] = []
        for hit in hits:
            chunk = by_id.get(hit.chunk_id)
            document = self.documents.get(chunk.document_id) if chunk else None
            if chunk is None or document is None:
                continue
            results.append(
                SearchResult(
                    chunk_id=chunk.id,
                    document_id=document.id,
                    document_uri=document.uri,
                    document_title=document.title,
                    content=chunk.content,
                    headings=chunk.headings,
                    order=chunk.order,
                    score=hit.score,
                    rank=ranked + len(results) + 1,
                    signal_ranks=dict(hit.ranks),
                )
            )
        return results
