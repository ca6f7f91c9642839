"""Retrieval signals: each turns a query into chunk ids, best first, for fusion.

A signal only ranks; it never scores across signals or hydrates chunks. That
keeps fusion (and a later reranker) the single place where order is decided.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from haiku.rag.store.base import Store


@dataclass(frozen=True)
class Query:
    """The query as signals see it; `vector` is None when no active signal needs it."""

    text: str
    vector: np.ndarray | None = None


@runtime_checkable
class Signal(Protocol):
    """A ranked list of chunk ids for a query.

    `name` is the key of the signal's RRF weight and of `SearchResult.signal_ranks`.
    `needs_vector` tells the retriever whether to embed the query for it (a signal
    without the attribute is assumed to need it).
    """

    name: str
    needs_vector: bool

    async def rank(
        self, query: Query, limit: int, document_ids: Collection[str] | None
    ) -> list[str]: ...


class VectorSignal:
    """Cosine kNN over chunk vectors."""

    name = "vector"
    needs_vector = True

    def __init__(self, store: Store) -> None:
        self.store = store

    async def rank(
        self, query: Query, limit: int, document_ids: Collection[str] | None
    ) -> list[str]:
        if query.vector is None:
            raise ValueError("The vector signal needs an embedded query (Query.vector is None)")
        hits = await asyncio.to_thread(self.store.vector_search, query.vector, limit, document_ids)
        return [chunk_id for chunk_id, _ in hits]


class KeywordSignal:
    """BM25 over chunk text, where the store has a keyword index."""

    name = "bm25"
    needs_vector = False

    def __init__(self, store: Store) -> None:
        self.store = store

    async def rank(
        self, query: Query, limit: int, document_ids: Collection[str] | None
    ) -> list[str]:
        if not self.store.features.keyword_search:
            return []
        hits = await asyncio.to_thread(self.store.keyword_search, query.text, limit, document_ids)
        return [chunk_id for chunk_id, _ in hits]


def default_signals(store: Store) -> list[Signal]:
    """Vector always; BM25 when the store can do keyword search."""
    signals: list[Signal] = [VectorSignal(store)]
    if store.features.keyword_search:
        signals.append(KeywordSignal(store))
    return signals
