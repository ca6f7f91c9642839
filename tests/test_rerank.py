"""Reranker providers (cross-encoder, LLM), their selection from config, and the retriever's
reranking path: candidate depth, no graph signal, fallback to RRF."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig, SearchConfig, config_from_dict
from haiku.rag.documents import SearchResult
from haiku.rag.errors import ConfigError
from haiku.rag.retrieval.hybrid import HybridRetriever
from haiku.rag.retrieval.rerank import (
    RERANK_INSTRUCTIONS,
    CrossEncoderReranker,
    LLMReranker,
    Reranker,
    make_reranker,
    passage_text,
)
from haiku.rag.retrieval.signals import Query


def result(chunk_id: str, content: str, headings: list[str] | None = None) -> SearchResult:
    return SearchResult(
        chunk_id=chunk_id,
        document_id="d",
        document_uri="file:///d.md",
        content=content,
        headings=headings or [],
        score=0.0,
        rank=1,
    )


CANDIDATES = [
    result("a", "Boil the pasta in salted water."),
    result("b", "Ada Lovelace wrote the first algorithm.", ["History", "Ada"]),
    result("c", "Charles Babbage designed the Analytical Engine."),
]


class FakeCrossEncoder:
    """Scores a pair by the words query and passage share; records how it was called."""

    instances: ClassVar[list[FakeCrossEncoder]] = []

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.calls: list[tuple[list[tuple[str, str]], dict[str, Any]]] = []
        FakeCrossEncoder.instances.append(self)

    def predict(self, sentences: Any, **kwargs: Any) -> np.ndarray:
        pairs = list(sentences)
        self.calls.append((pairs, kwargs))
        return np.array(
            [len(set(q.lower().split()) & set(p.lower().split())) for q, p in pairs],
            dtype=np.float32,
        )


@pytest.fixture
def fake_sentence_transformers(monkeypatch: pytest.MonkeyPatch) -> type[FakeCrossEncoder]:
    FakeCrossEncoder.instances = []
    module = types.ModuleType("sentence_transformers")
    module.CrossEncoder = FakeCrossEncoder  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sentence_transformers", module)
    return FakeCrossEncoder


# cross-encoder -----------------------------------------------------------------------


async def test_cross_encoder_scores_pairs_best_first() -> None:
    model = FakeCrossEncoder()
    reranker = CrossEncoderReranker("fake", model=model, batch_size=8)
    assert isinstance(reranker, Reranker)
    ranked = await reranker.rerank("who wrote the first algorithm", CANDIDATES)
    assert [chunk_id for chunk_id, _ in ranked] == ["b", "a", "c"]
    assert ranked[0][1] == 3.0 and ranked[1][1] == ranked[2][1] == 1.0  # ties keep fused order
    pairs, kwargs = model.calls[0]
    assert pairs[1] == ("who wrote the first algorithm", "History > Ada\n" + CANDIDATES[1].content)
    assert kwargs == {"batch_size": 8, "show_progress_bar": False}
    assert await reranker.rerank("q", []) == []
    assert reranker.model_name == "cross-encoder:fake"


async def test_cross_encoder_loads_lazily_and_once(
    fake_sentence_transformers: type[FakeCrossEncoder],
) -> None:
    reranker = make_reranker("cross-encoder: some/model ")
    assert isinstance(reranker, CrossEncoderReranker)
    assert fake_sentence_transformers.instances == []  # nothing loaded yet
    await reranker.rerank("ada", CANDIDATES)
    await reranker.rerank("pasta", CANDIDATES)
    assert [m.name for m in fake_sentence_transformers.instances] == ["some/model"]


async def test_cross_encoder_without_sentence_transformers_fails_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(RuntimeError, match="`local` extra"):
        await CrossEncoderReranker("x").rerank("q", CANDIDATES)


async def test_cross_encoder_with_a_wrong_number_of_scores_raises() -> None:
    class Short:
        def predict(self, sentences: Any, **kwargs: Any) -> list[float]:
            return [1.0]

    with pytest.raises(ValueError, match="1 scores for 3 passages"):
        await CrossEncoderReranker("short", model=Short()).rerank("q", CANDIDATES)


@pytest.mark.slow  # imports torch and transformers
async def test_a_real_tiny_cross_encoder_loads_from_a_local_path(tmp_path: Path) -> None:
    """The real sentence-transformers loading code, on a tiny random BERT built offline."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("sentence_transformers")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *["ada", "pasta", "water", "the"]]
    (tmp_path / "vocab.txt").write_text("\n".join(words))
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt"))
    config = transformers.BertConfig(
        vocab_size=len(words),
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=64,
        num_labels=1,
    )
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    reranker = make_reranker(f"cross-encoder:{tmp_path}")
    assert reranker is not None
    ranked = await reranker.rerank("ada", CANDIDATES)
    assert sorted(chunk_id for chunk_id, _ in ranked) == ["a", "b", "c"]
    assert all(isinstance(score, float) for _, score in ranked)


# LLM reranker -------------------------------------------------------------------------


def scoring_model(scores: list[dict[str, Any]], seen: list[Any] | None = None) -> FunctionModel:
    def run(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if seen is not None:
            seen.append((messages, info))
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"scores": scores})])

    return FunctionModel(run)


async def test_llm_reranker_scores_numbered_passages() -> None:
    seen: list[Any] = []
    model = scoring_model([{"id": 3, "score": 0.7}, {"id": 2, "score": 0.95}], seen)
    reranker = LLMReranker(model, max_chars=20)
    ranked = await reranker.rerank("Who designed the engine?", CANDIDATES)
    # Scored passages first (best first), the unscored one after them, in fused order.
    assert ranked == [("b", 0.95), ("c", 0.7), ("a", 0.0)]
    messages, info = seen[0]
    assert info.instructions == RERANK_INSTRUCTIONS
    prompt = messages[0].parts[0].content
    assert prompt.startswith("Query: Who designed the engine?")
    assert '<passage id="2">History > Ada\nAda Lo</passage>' in prompt
    assert reranker.model_name.startswith("function:")
    assert await reranker.rerank("q", []) == []


async def test_llm_reranker_ignores_unknown_repeated_and_nan_ids() -> None:
    scores = [
        {"id": 0, "score": 1.0},
        {"id": 9, "score": 1.0},
        {"id": 1, "score": 1.7},
        {"id": 1, "score": 0.1},
        {"id": 2, "score": float("nan")},
        {"id": 3, "score": -4},
    ]
    ranked = await LLMReranker(scoring_model(scores)).rerank("q", CANDIDATES)
    assert ranked == [("a", 1.0), ("c", 0.0), ("b", 0.0)]


def test_make_reranker() -> None:
    assert make_reranker(None) is None
    assert make_reranker("  ") is None
    llm = make_reranker("openai:gpt-5-mini")
    assert isinstance(llm, LLMReranker) and llm.model_name == "openai:gpt-5-mini"
    with pytest.raises(ConfigError, match="cross-encoder:NAME_OR_PATH"):
        make_reranker("cross-encoder:")
    assert passage_text(CANDIDATES[0]) == CANDIDATES[0].content


# the retriever's reranking path ---------------------------------------------------------


class Spy:
    """A signal with a fixed ranking that records the depth it was asked for."""

    needs_vector = False

    def __init__(self, name: str, ranking: list[str]) -> None:
        self.name = name
        self.ranking = ranking
        self.limits: list[int] = []

    async def rank(self, query: Query, limit: int, document_ids: Collection[str] | None):
        self.limits.append(limit)
        return self.ranking[:limit]


def rerank_config(tmp_path: Path, **search: Any) -> AppConfig:
    return config_from_dict(
        {
            "embeddings": {"model": "hash:v1", "dimension": 256},
            "storage": {"data_dir": str(tmp_path / "data")},
            "search": search,
        }
    )


@pytest.fixture
async def kb(tmp_path: Path, corpus: Path):
    async with HaikuRAG(tmp_path / "kb.lancedb", rerank_config(tmp_path), create=True) as kb:
        await kb.add(str(corpus))
        yield kb


async def test_reranker_candidate_depth(kb: HaikuRAG) -> None:
    ids = [r.chunk_id for r in await kb.search("search engine", top_k=5)]
    bm25, graph = Spy("bm25", ids), Spy("graph", ids[::-1])

    class Identity:
        async def rerank(self, query: str, candidates: Sequence[SearchResult]):
            return [(c.chunk_id, 1.0) for c in candidates]

    search = SearchConfig(candidates=7, rerank_candidates=3)
    plain = HybridRetriever(kb.store, kb.embedder, search, signals=[bm25, graph])
    await plain.search("q", top_k=2)
    assert bm25.limits == [7] and graph.limits == [7]
    reranked = HybridRetriever(
        kb.store, kb.embedder, search, signals=[bm25, graph], reranker=Identity()
    )
    results = await reranked.search("q", top_k=2)
    assert bm25.limits == [7, 3] and graph.limits == [7]  # graph not run under a reranker
    assert len(results) == 2
    assert all(set(r.signal_ranks) == {"bm25"} for r in results)


async def test_a_reranker_that_returns_nothing_usable_falls_back(
    kb: HaikuRAG, caplog: pytest.LogCaptureFixture
) -> None:
    class Unknown:
        async def rerank(self, query: str, candidates: Sequence[SearchResult]):
            return [("not-a-candidate", 1.0)]

    kb.reranker = None
    plain = await kb.search("Rust search engine", top_k=3)
    kb.reranker = Unknown()
    with caplog.at_level(logging.WARNING):
        results = await kb.search("Rust search engine", top_k=3)
    assert [r.chunk_id for r in results] == [r.chunk_id for r in plain]
    assert "returned none of the candidates" in caplog.text


async def test_configured_cross_encoder_reranks_client_search(
    tmp_path: Path, corpus: Path, fake_sentence_transformers: type[FakeCrossEncoder]
) -> None:
    config = rerank_config(tmp_path, reranker_model="cross-encoder:fake", rerank_candidates=10)
    async with HaikuRAG(tmp_path / "kb.lancedb", config, create=True) as kb:
        await kb.add(str(corpus))
        results = await kb.search("spaghetti garlic olive oil", top_k=2)
        assert results[0].document_uri.endswith("pasta.md")
        assert results[0].score == 3.0  # the cross-encoder's score (shared words), not RRF's
        info = await kb.info()
        assert info.extra["reranker"] == "cross-encoder:fake"
        assert info.signals == ["vector", "bm25"]


async def test_a_missing_cross_encoder_falls_back_to_rrf(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    config = rerank_config(tmp_path, reranker_model="cross-encoder:gone")
    async with HaikuRAG(tmp_path / "kb.lancedb", config, create=True) as kb:
        await kb.add(str(corpus))
        with caplog.at_level(logging.WARNING):
            results = await kb.search("spaghetti", top_k=2)
    assert results and results[0].document_uri.endswith("pasta.md")
    assert "falling back to RRF" in caplog.text and "`local` extra" in caplog.text


async def test_llm_reranker_through_the_client(tmp_path: Path, corpus: Path) -> None:
    async with HaikuRAG(tmp_path / "kb.lancedb", rerank_config(tmp_path), create=True) as kb:
        await kb.add(str(corpus))
        kb.reranker = LLMReranker(scoring_model([{"id": 2, "score": 0.9}]))
        results = await kb.search("bread", top_k=2)
    assert results[0].score == 0.9 and results[1].score == 0.0
