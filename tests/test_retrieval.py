"""Fusion math, signals and the hybrid retriever over a real LanceDB store."""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import pytest

from haiku.rag.config import SearchConfig
from haiku.rag.documents import Chunk, Document, SearchResult, chunk_id_for
from haiku.rag.retrieval.fusion import FusedHit, weighted_rrf
from haiku.rag.retrieval.hybrid import HybridRetriever
from haiku.rag.retrieval.rerank import Reranker
from haiku.rag.retrieval.signals import (
    KeywordSignal,
    Query,
    Signal,
    VectorSignal,
    default_signals,
)
from haiku.rag.store.base import StoreFeatures, StoreSettings
from haiku.rag.store.lancedb import LanceDBStore

# fusion ----------------------------------------------------------------------


def test_weighted_rrf_exact_scores_and_order() -> None:
    fused = weighted_rrf(
        {"vector": ["a", "b", "c"], "bm25": ["c", "a", "d"]},
        {"vector": 1.125, "bm25": 1.0},
        k=60,
    )
    assert [hit.chunk_id for hit in fused] == ["a", "c", "b", "d"]
    assert fused[0] == FusedHit("a", math.fsum([1.125 / 61, 1.0 / 62]), {"vector": 1, "bm25": 2})
    assert fused[1] == FusedHit("c", math.fsum([1.125 / 63, 1.0 / 61]), {"vector": 3, "bm25": 1})
    assert fused[2] == FusedHit("b", 1.125 / 62, {"vector": 2})
    assert fused[3] == FusedHit("d", 1.0 / 63, {"bm25": 3})
    assert fused[0].score == pytest.approx(0.034571, abs=1e-6)


def test_weighted_rrf_constant_k_changes_scores() -> None:
    fused = weighted_rrf({"x": ["a", "b"]}, {"x": 2.0}, k=1)
    assert [(hit.chunk_id, hit.score) for hit in fused] == [("a", 1.0), ("b", 2.0 / 3)]


def test_weighted_rrf_ties_break_by_best_rank_then_id() -> None:
    # Symmetric: equal scores, equal best rank -> chunk id decides.
    fused = weighted_rrf({"x": ["q", "p"], "y": ["p", "q"]}, {"x": 1.0, "y": 1.0})
    assert [hit.chunk_id for hit in fused] == ["p", "q"]
    assert fused[0].score == fused[1].score
    # 2/(60+62) == 1/(60+1): equal scores, but "z" was ranked first by a signal.
    filler = [f"f{i:02d}" for i in range(61)]
    fused = weighted_rrf({"x": [*filler, "a"], "y": ["z"]}, {"x": 2.0, "y": 1.0})
    tied = [hit for hit in fused if hit.chunk_id in {"a", "z"}]
    assert tied[0].score == tied[1].score
    assert [hit.chunk_id for hit in tied] == ["z", "a"]


def test_weighted_rrf_counts_a_repeated_id_once_at_its_best_rank() -> None:
    fused = weighted_rrf({"x": ["a", "b", "a"]}, {"x": 1.0})
    assert [(hit.chunk_id, hit.ranks) for hit in fused] == [("a", {"x": 1}), ("b", {"x": 2})]
    assert fused[0].score == 1.0 / 61


def test_weighted_rrf_rejects_bad_input() -> None:
    assert weighted_rrf({}, {}) == []
    with pytest.raises(ValueError, match="No RRF weight for signal"):
        weighted_rrf({"graph": ["a"]}, {"vector": 1.0})
    with pytest.raises(ValueError, match="positive"):
        weighted_rrf({"x": ["a"]}, {"x": 1.0}, k=0)


# a store with a deterministic "semantic" embedder ------------------------------

DIM = 8
CONCEPTS = {
    "car": 0, "automobile": 0, "vehicle": 0, "engine": 0, "motor": 0,
    "banana": 1, "apple": 1, "fruit": 1,
    "pasta": 2, "recipe": 2, "bread": 2, "kitchen": 2,
    "boat": 3, "sea": 3, "ocean": 3,
}  # fmt: skip
UNKNOWN_AXIS = 7


class ConceptEmbedder:
    """Synonyms share an axis (so vectors find paraphrases); other words are ignored
    (so vectors miss rare codes that BM25 finds)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def encode(self, text: str) -> np.ndarray:
        vector = np.zeros(DIM, dtype=np.float32)
        for word in text.lower().replace(".", " ").split():
            if word in CONCEPTS:
                vector[CONCEPTS[word]] += 1.0
        if not vector.any():
            vector[UNKNOWN_AXIS] = 1.0
        return vector / np.linalg.norm(vector)

    async def embed_query(self, text: str) -> np.ndarray:
        self.calls.append(text)
        return self.encode(text)


DOCS = {
    "cars.md": ["automobile engine maintenance", "motor oil for the car"],
    "fruit.md": ["banana and apple fruit salad"],
    "kitchen.md": ["pasta recipe with bread"],
    "zorblax.md": ["zorblax quarterly report"],
    "sea.md": ["a boat on the sea"],
}


@pytest.fixture
def embedder() -> ConceptEmbedder:
    return ConceptEmbedder()


@pytest.fixture
def store(tmp_path: Path, embedder: ConceptEmbedder):
    settings = StoreSettings(
        driver="lancedb", embedding_model="test:concepts", embedding_dim=DIM,
        chunk_size=100, chunk_overlap=0,
    )  # fmt: skip
    store = LanceDBStore.create(tmp_path / "kb.lancedb", settings)
    for uri, texts in DOCS.items():
        doc = Document.from_text(" ".join(texts), uri=uri, title=uri.removesuffix(".md"))
        chunks = [
            Chunk(id=chunk_id_for(doc.id, i, t), document_id=doc.id, order=i, content=t)
            for i, t in enumerate(texts)
        ]
        store.write([doc], chunks, np.stack([embedder.encode(t) for t in texts]))
    yield store
    store.close()


def chunk_of(store: LanceDBStore, uri: str, order: int = 0) -> str:
    doc = next(d for d in store.list_documents() if d.uri == uri)
    return store.document_chunks(doc.id)[order].id


def retriever(store, embedder, **config) -> HybridRetriever:
    return HybridRetriever(store, embedder, SearchConfig(**config))


# signals -----------------------------------------------------------------------


async def test_signals_rank_chunk_ids(store: LanceDBStore, embedder: ConceptEmbedder) -> None:
    query = Query("vehicle zorblax", embedder.encode("vehicle zorblax"))
    assert isinstance(VectorSignal(store), Signal)
    top = await VectorSignal(store).rank(query, 2, None)
    assert set(top) == {chunk_of(store, "cars.md", 0), chunk_of(store, "cars.md", 1)}
    assert await KeywordSignal(store).rank(query, 5, None) == [chunk_of(store, "zorblax.md")]
    with pytest.raises(ValueError, match="embedded query"):
        await VectorSignal(store).rank(Query("text"), 2, None)


class NoKeywordStore:
    features = StoreFeatures(keyword_search=False)

    def keyword_search(self, *args: object) -> list[tuple[str, float]]:
        raise AssertionError("must not be called")


async def test_keyword_signal_only_where_the_store_has_it() -> None:
    store = NoKeywordStore()
    assert [s.name for s in default_signals(store)] == ["vector"]  # type: ignore[arg-type]
    assert await KeywordSignal(store).rank(Query("x"), 5, None) == []  # type: ignore[arg-type]


# hybrid search -----------------------------------------------------------------


async def test_vector_only_and_bm25_only_hits_both_appear(store, embedder) -> None:
    # Each signal's best hit is one the other signal misses: the vector signal finds
    # a paraphrase (no shared word), BM25 the rare code the embedder cannot see.
    search = retriever(store, embedder, candidates=1, vector_weight=1.0)
    results = await search.search("vehicle zorblax", top_k=2)
    by_uri = {r.document_uri: r for r in results}
    assert set(by_uri) == {"cars.md", "zorblax.md"}
    assert by_uri["cars.md"].signal_ranks == {"vector": 1}
    assert by_uri["zorblax.md"].signal_ranks == {"bm25": 1}
    assert [r.score for r in results] == [1.0 / 61, 1.0 / 61]
    assert [r.rank for r in results] == [1, 2]
    cars = by_uri["cars.md"]
    assert cars.document_title == "cars"
    assert cars.content in DOCS["cars.md"]
    assert cars.document_id == next(d.id for d in store.list_documents() if d.uri == "cars.md")

    # With 50 candidates kNN ranks every chunk, so the BM25 hit also gets a (poor)
    # vector rank; agreement of two signals beats one signal's first place.
    results = await retriever(store, embedder).search("vehicle zorblax", top_k=3)
    assert results[0].document_uri == "zorblax.md"
    assert results[0].signal_ranks["bm25"] == 1 and results[0].signal_ranks["vector"] > 2
    assert {r.document_uri for r in results[1:]} == {"cars.md"}


async def test_top_k_and_ranks(store, embedder) -> None:
    search = retriever(store, embedder, top_k=3)
    assert len(await search.search("car recipe")) == 3
    results = await search.search("car recipe", top_k=6)
    assert len(results) == 6
    assert [r.rank for r in results] == [1, 2, 3, 4, 5, 6]
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)
    assert len({r.chunk_id for r in results}) == 6
    # top_k above `candidates` still fills up.
    assert len(await retriever(store, embedder, candidates=2).search("car", top_k=6)) == 6
    with pytest.raises(ValueError, match="top_k"):
        await search.search("car", top_k=0)
    assert await search.search("   ") == []


async def test_document_filter(store, embedder) -> None:
    docs = {d.uri: d.id for d in store.list_documents()}
    search = retriever(store, embedder)
    results = await search.search("car banana", top_k=10, document_ids={docs["fruit.md"]})
    assert [r.document_uri for r in results] == ["fruit.md"]
    two = await search.search("car", top_k=10, document_ids=[docs["sea.md"], docs["cars.md"]])
    assert {r.document_uri for r in two} == {"sea.md", "cars.md"}
    assert await search.search("car", document_ids=[]) == []


async def test_signals_restriction(store, embedder) -> None:
    search = retriever(store, embedder)
    vector_only = await search.search("automobile", top_k=10, signals={"vector"})
    assert len(vector_only) == 6  # kNN ranks every chunk
    assert all(set(r.signal_ranks) == {"vector"} for r in vector_only)
    assert vector_only[0].score == pytest.approx(1.125 / 61)

    embedder.calls.clear()
    bm25_only = await search.search("automobile", top_k=10, signals=["bm25"])
    assert [r.chunk_id for r in bm25_only] == [chunk_of(store, "cars.md", 0)]
    assert bm25_only[0].signal_ranks == {"bm25": 1}
    assert embedder.calls == []  # no signal needed a vector
    with pytest.raises(ValueError, match=r"Unknown signal\(s\) graph; available: vector, bm25"):
        await search.search("car", signals={"graph"})


async def test_zero_weight_signals_do_not_run(store, embedder) -> None:
    search = retriever(store, embedder, vector_weight=0.0)
    results = await search.search("automobile", top_k=10)
    assert [r.signal_ranks for r in results] == [{"bm25": 1}]


class GhostSignal:
    """Ranks ids that do not exist (deleted meanwhile, or orphaned) before real ones."""

    name = "ghost"
    needs_vector = False

    def __init__(self, real: list[str]) -> None:
        self.real = real

    async def rank(self, query: Query, limit: int, document_ids: Collection[str] | None):
        return ["missing-1", "missing-2", *self.real][:limit]


async def test_hydration_skips_vanished_chunks(store, embedder) -> None:
    real = [chunk_of(store, "sea.md"), chunk_of(store, "fruit.md")]
    search = HybridRetriever(store, embedder, SearchConfig(), signals=[GhostSignal(real)])
    assert search.weight("ghost") == 1.0
    results = await search.search("anything", top_k=1)
    assert [(r.chunk_id, r.rank) for r in results] == [(real[0], 1)]
    results = await search.search("anything", top_k=5)
    assert [(r.chunk_id, r.rank) for r in results] == [(real[0], 1), (real[1], 2)]
    assert results[0].signal_ranks == {"ghost": 3}


async def test_hydration_skips_chunks_without_a_document(store, embedder) -> None:
    orphan = Document.from_text("orphan", uri="orphan.md")
    chunk = Chunk(id="orphan-chunk", document_id=orphan.id, order=0, content="orphan")
    data, _, ids = store._validated([orphan], [chunk], np.stack([embedder.encode("x")]))
    store._merge_chunks(data, ids)  # as if a write died before the document row
    search = HybridRetriever(
        store, embedder, SearchConfig(), signals=[GhostSignal(["orphan-chunk"])]
    )
    assert await search.search("orphan") == []


def test_signal_names_must_be_unique(store, embedder) -> None:
    with pytest.raises(ValueError, match="unique"):
        HybridRetriever(store, embedder, SearchConfig(), signals=[VectorSignal(store)] * 2)


# reranking ---------------------------------------------------------------------


class ReverseReranker:
    """Scores candidates in reverse of the order it received, plus noise to ignore."""

    def __init__(self) -> None:
        self.seen: list[SearchResult] = []

    async def rerank(self, query: str, candidates: Sequence[SearchResult]):
        self.seen = list(candidates)
        scored = [(c.chunk_id, float(i)) for i, c in enumerate(candidates)]
        reverse = sorted(scored, key=lambda pair: -pair[1])
        return [("not-a-candidate", 99.0), *reverse, reverse[0]]


class BrokenReranker:
    async def rerank(self, query: str, candidates: Sequence[SearchResult]):
        raise TimeoutError("provider timed out")


async def test_reranker_replaces_the_fused_order(store, embedder) -> None:
    plain = await retriever(store, embedder).search("car fruit", top_k=10)
    reranker = ReverseReranker()
    assert isinstance(reranker, Reranker)
    search = HybridRetriever(store, embedder, SearchConfig(), reranker=reranker)
    results = await search.search("car fruit", top_k=3)
    # The reranker saw the whole union of candidates, in fused order.
    assert [c.chunk_id for c in reranker.seen] == [r.chunk_id for r in plain]
    assert [r.chunk_id for r in results] == [r.chunk_id for r in reversed(plain)][:3]
    assert [r.score for r in results] == [5.0, 4.0, 3.0]
    assert [r.rank for r in results] == [1, 2, 3]
    assert results[0].signal_ranks == plain[-1].signal_ranks
    everything = await search.search("car fruit", top_k=50)  # fewer than top_k exist
    assert [r.chunk_id for r in everything] == [r.chunk_id for r in reversed(plain)]


async def test_reranker_drops_the_graph_signal(store, embedder) -> None:
    class GraphSignal(GhostSignal):
        name = "graph"

    graph = GraphSignal([chunk_of(store, "sea.md")])
    reranked = HybridRetriever(
        store, embedder, SearchConfig(), signals=[graph], reranker=ReverseReranker()
    )
    assert await reranked.search("boat") == []
    fused = HybridRetriever(store, embedder, SearchConfig(), signals=[graph])
    results = await fused.search("boat")
    assert results[0].score == pytest.approx(0.9 / 63)  # graph_weight, rank 3


async def test_reranker_failure_falls_back_to_rrf(store, embedder, caplog) -> None:
    plain = await retriever(store, embedder).search("car fruit", top_k=4)
    search = HybridRetriever(store, embedder, SearchConfig(), reranker=BrokenReranker())
    with caplog.at_level(logging.WARNING, logger="haiku.rag.retrieval.hybrid"):
        results = await search.search("car fruit", top_k=4)
    assert results == plain
    assert "Reranker failed (TimeoutError: provider timed out)" in caplog.text
    assert "falling back to RRF" in caplog.text


async def test_reranker_with_no_candidates(store, embedder) -> None:
    reranker = ReverseReranker()
    search = HybridRetriever(store, embedder, SearchConfig(), reranker=reranker)
    assert await search.search("nothing matches this", signals={"bm25"}) == []
    assert reranker.seen == []
