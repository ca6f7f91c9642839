"""The knowledge graph: merging, persistence in every writable driver, the graph signal, and
its wiring into the client (add, change, delete, rebuild, info, reranker)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from graph_support import MALFORMED, ScriptedExtractor, entity, relation

from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig, config_from_dict
from haiku.rag.documents import Chunk, SearchResult, document_id_for
from haiku.rag.errors import StoreError
from haiku.rag.retrieval.extract import ChunkExtractor, EntityType, Extraction
from haiku.rag.retrieval.graph import (
    GRAPH_FORMAT,
    GraphSignal,
    KnowledgeGraph,
    load_graph,
    normalize_name,
    relation_type,
    tokens,
    update_graph,
)
from haiku.rag.retrieval.signals import Query
from haiku.rag.store import DRIVERS

# a small corpus whose facts are split across documents ---------------------------

CORPUS = {
    "ada.md": "# Ada Lovelace\n\nAda Lovelace wrote the first published algorithm and worked "
    "closely with Charles Babbage.\n",
    "engine.md": "# The Engine\n\nThe Analytical Engine was a general-purpose mechanical "
    "computer designed by Charles Babbage.\n",
    "mill.md": "# The Mill\n\nThe Mill was the arithmetic unit of the Analytical Engine.\n",
    "pasta.md": "# Pasta\n\nBoil salted water and cook the spaghetti for nine minutes.\n",
}

FACTS: dict[str, dict[str, Any] | str] = {
    "Ada Lovelace wrote": {
        "entities": [
            entity("Ada Lovelace", "PERSON", "Mathematician who wrote the first algorithm."),
            entity("Charles Babbage", "PERSON", "Worked closely with Ada Lovelace."),
        ],
        "relationships": [relation("Ada Lovelace", "Charles Babbage", "worked with", 0.9)],
    },
    "Analytical Engine was": {
        "entities": [
            entity("Analytical Engine", "TECHNOLOGY", "A general-purpose mechanical computer."),
            entity("charles  BABBAGE", "OTHER", "Designer of the engine."),
        ],
        "relationships": [relation("Charles Babbage", "Analytical Engine", "DESIGNED", 0.8)],
    },
    "The Mill was": {
        "entities": [entity("Mill", "CONCEPT", "The arithmetic unit.")],
        "relationships": [relation("Mill", "Analytical Engine", "PART_OF", 1.0)],
    },
}


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def graph_config(tmp_path: Path, **graph: Any) -> AppConfig:
    return config_from_dict(
        {
            "embeddings": {"model": "hash:v1", "dimension": 256},
            "storage": {"data_dir": str(tmp_path / "data")},
            "graph": {"extractor_model": "test", **graph},
        }
    )


def _importable(driver: str) -> bool:
    module = DRIVERS.get(driver, "").partition(":")[0]
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return bool(module)


WRITABLE = [
    pytest.param(
        driver,
        marks=pytest.mark.skipif(not _importable(driver), reason=f"{driver} not available"),
    )
    for driver in ("lancedb", "yaml", "duckdb")
]
SUFFIX = {"lancedb": ".lancedb", "yaml": ".yaml", "duckdb": ".duckdb"}


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    return _write(tmp_path / "corpus", CORPUS)


@pytest.fixture
def scripted() -> ScriptedExtractor:
    return ScriptedExtractor(FACTS)


async def open_kb(
    path: Path, config: AppConfig, scripted: ScriptedExtractor | None, **options: Any
) -> HaikuRAG:
    kb = HaikuRAG(path, config, create=True, **options)
    if scripted is not None:  # the configured extractor, with the scripted model
        graph = config.graph
        kb.extractor = ChunkExtractor(
            scripted.model(),
            prompt=graph.extractor_prompt,
            concurrency=graph.concurrency,
            max_retries=graph.max_retries,
        )
    return await kb.open()


def uris(results: Sequence[SearchResult]) -> list[str]:
    return [Path(result.document_uri).name for result in results]


async def graph_only(kb: HaikuRAG, query: str) -> list[str]:
    return uris(await kb.retriever.search(query, top_k=10, signals={"graph"}))


# building, persisting and querying through the client ----------------------------


@pytest.mark.parametrize("driver", WRITABLE)
async def test_graph_is_built_persisted_and_searched(
    driver: str, tmp_path: Path, corpus_dir: Path, scripted: ScriptedExtractor
) -> None:
    path = tmp_path / f"kb{SUFFIX[driver]}"
    config = graph_config(tmp_path)
    kb = await open_kb(path, config, scripted)
    try:
        report = await kb.add(str(corpus_dir))
        assert report.chunks_extracted == 4 == scripted.calls
        assert "4 chunks extracted to the graph" in report.summary()
        assert "graph" in kb.retriever.signal_names
    finally:
        kb.close()

    # Reopened by a fresh client (no extractor needed to search): the graph came back.
    async with HaikuRAG(path, config.model_copy(update={"graph": type(config.graph)()})) as again:
        assert again.extractor is None
        stats = await again.graph_stats()
        assert stats is not None
        assert (stats.entities, stats.relationships, stats.chunks) == (4, 3, 4)
        babbage = next(info for info in stats.top if info.name == "Charles Babbage")
        assert (babbage.type, babbage.mentions, babbage.degree) == ("PERSON", 2, 2)
        # Ada's chunk (the seed), then the engine chunk, linked only through Babbage.
        assert await graph_only(again, "Who did Ada Lovelace work with?") == ["ada.md", "engine.md"]
        results = await again.search("Ada Lovelace", top_k=4)
        engine = next(r for r in results if r.document_uri.endswith("engine.md"))
        assert engine.signal_ranks["graph"] == 2
        info = await again.info()
        assert "graph" in info.signals
        assert info.extra["graph"] == "4 entities, 3 relationships, from 4 chunks"


async def test_hops_bound_the_expansion(
    tmp_path: Path, corpus_dir: Path, scripted: ScriptedExtractor
) -> None:
    async with await open_kb(tmp_path / "kb.lancedb", graph_config(tmp_path), scripted) as kb:
        await kb.add(str(corpus_dir))
    results = {}
    for hops in (0, 1, 2):
        config = graph_config(tmp_path, hops=hops)
        async with HaikuRAG(tmp_path / "kb.lancedb", config) as kb:
            results[hops] = await graph_only(kb, "Ada Lovelace")
    assert results[0] == ["ada.md"]
    assert results[1] == ["ada.md", "engine.md"]
    assert results[2] == ["ada.md", "engine.md", "mill.md"]


async def test_readding_unchanged_documents_calls_the_extractor_zero_times(
    tmp_path: Path, corpus_dir: Path, scripted: ScriptedExtractor
) -> None:
    async with await open_kb(tmp_path / "kb.lancedb", graph_config(tmp_path), scripted) as kb:
        await kb.add(str(corpus_dir))
        assert scripted.calls == 4
        report = await kb.add(str(corpus_dir))
        assert report.chunks_extracted == 0
        # Rebuild re-links every chunk from the cache: still no model call.
        await kb.rebuild()
        assert scripted.calls == 4
        assert (await kb.graph_stats()).entities == 4  # type: ignore[union-attr]
    # A second process re-adding the same files does not call it either.
    async with await open_kb(tmp_path / "kb.lancedb", graph_config(tmp_path), scripted) as kb:
        await kb.add(str(corpus_dir))
    assert scripted.calls == 4


async def test_changed_and_deleted_documents_withdraw_their_support(
    tmp_path: Path, corpus_dir: Path, scripted: ScriptedExtractor
) -> None:
    async with await open_kb(tmp_path / "kb.lancedb", graph_config(tmp_path), scripted) as kb:
        await kb.add(str(corpus_dir))
        # Deleting the engine document drops the engine's DESIGNED edge and Babbage's
        # second mention; the Mill still names the engine, so the engine stays.
        assert await kb.delete_document(str(corpus_dir / "engine.md"))
        (corpus_dir / "engine.md").unlink()
        graph = kb._graph
        assert graph is not None
        assert graph.entity("Charles Babbage").mentions == 1  # type: ignore[union-attr]
        assert graph.relationship_count == 2
        assert await graph_only(kb, "Analytical Engine") == ["mill.md"]

        # Changing the mill document replaces its links: the Mill entity goes away.
        (corpus_dir / "mill.md").write_text("# The Mill\n\nNothing to see here.\n")
        report = await kb.add(str(corpus_dir))
        assert report.updated[0].endswith("mill.md")
        assert graph.entity("Mill") is None
        assert graph.entity("Analytical Engine") is None
        assert graph.entity_count == 2

        # A source that vanishes from a directory is pruned from the graph too.
        (corpus_dir / "ada.md").unlink()
        await kb.add(str(corpus_dir))
        assert graph.empty
        assert "graph" not in kb.retriever.signal_names
        # The cache keeps only what linked chunks use (pasta and the new mill: nothing).
        assert len(graph.extractions) == len(graph.chunks) == 2
    async with HaikuRAG(tmp_path / "kb.lancedb", graph_config(tmp_path)) as kb:
        assert "graph" not in (await kb.info()).signals


async def test_malformed_extractor_json_is_skipped_with_a_warning(
    tmp_path: Path, corpus_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scripted = ScriptedExtractor({**FACTS, "The Mill was": MALFORMED})
    config = graph_config(tmp_path, max_retries=1)
    async with await open_kb(tmp_path / "kb.lancedb", config, scripted) as kb:
        with caplog.at_level(logging.WARNING):
            report = await kb.add(str(corpus_dir))
        mill = kb.store.document_chunks(doc_id(corpus_dir / "mill.md"))[0]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(mill.id in message and "invalid" in message for message in warnings)
        assert report.chunks_extracted == 3
        assert kb._graph is not None and kb._graph.entity("Mill") is None
        assert await graph_only(kb, "Ada Lovelace") == ["ada.md", "engine.md"]
        calls = scripted.calls
        # The skipped chunk is not retried by a plain add, only by rebuild.
        await kb.add(str(corpus_dir))
        assert scripted.calls == calls
        await kb.rebuild()
        assert scripted.calls == calls + 2  # one call plus one output retry


def doc_id(path: Path) -> str:
    return document_id_for(path.resolve().as_uri())


async def test_no_extractor_means_no_graph_signal_and_no_cost(
    tmp_path: Path, corpus_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = config_from_dict({"embeddings": {"model": "hash:v1", "dimension": 256}})
    saves: list[Any] = []
    async with HaikuRAG(tmp_path / "kb.lancedb", config, create=True) as kb:
        assert kb.extractor is None
        monkeypatch.setattr(kb.store, "save_graph", saves.append)
        monkeypatch.setattr(kb.store, "document_chunks", pytest.fail)
        await kb.add(str(corpus_dir))
        await kb.rebuild()
        assert kb.retriever.signal_names == ["vector", "bm25"]
        assert (await kb.info()).signals == ["vector", "bm25"]
        assert (await kb.graph_stats()).entities == 0  # type: ignore[union-attr]
    assert saves == []


async def test_with_a_reranker_the_graph_signal_is_not_used(
    tmp_path: Path, corpus_dir: Path, scripted: ScriptedExtractor
) -> None:
    class Reverse:
        model_name = "reverse"

        def __init__(self) -> None:
            self.seen: list[SearchResult] = []

        async def rerank(self, query: str, candidates: Sequence[SearchResult]):
            self.seen = list(candidates)
            return [(c.chunk_id, float(i)) for i, c in enumerate(candidates)][::-1]

    async with await open_kb(tmp_path / "kb.lancedb", graph_config(tmp_path), scripted) as kb:
        await kb.add(str(corpus_dir))
        reverse = Reverse()
        kb.reranker = reverse
        results = await kb.search("Ada Lovelace", top_k=4)
        assert results
        assert all("graph" not in result.signal_ranks for result in reverse.seen)
        assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)
        info = await kb.info()
        assert "graph" not in info.signals and info.extra["reranker"] == "reverse"
        # The reranker survives the retriever being rebuilt after an add.
        await kb.add(str(corpus_dir))
        assert kb.retriever.reranker is reverse


async def test_a_failing_reranker_falls_back_to_rrf(
    tmp_path: Path, corpus_dir: Path, scripted: ScriptedExtractor, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        async def rerank(self, query: str, candidates: Sequence[SearchResult]):
            raise RuntimeError("reranker is down")

    async with await open_kb(tmp_path / "kb.lancedb", graph_config(tmp_path), scripted) as kb:
        await kb.add(str(corpus_dir))
        kb.reranker = None
        plain = await kb.retriever.search("Ada Lovelace", top_k=3, signals={"vector", "bm25"})
        kb.reranker = Broken()
        with caplog.at_level(logging.WARNING):
            results = await kb.search("Ada Lovelace", top_k=3)
        assert [r.chunk_id for r in results] == [r.chunk_id for r in plain]
        assert "falling back to RRF" in caplog.text
        assert (await kb.info()).extra["reranker"] == "Broken"


async def test_extraction_progress_and_add_text(
    tmp_path: Path, scripted: ScriptedExtractor
) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.events: list[tuple[str, str, int]] = []

        def start(self, task: str, total: int) -> None:
            self.events.append(("start", task, total))

        def advance(self, task: str, amount: int = 1) -> None:
            self.events.append(("advance", task, amount))

    corpus = _write(tmp_path / "c", {"a.md": CORPUS["ada.md"], "b.md": CORPUS["engine.md"]})
    progress = Recorder()
    async with await open_kb(tmp_path / "kb.lancedb", graph_config(tmp_path), scripted) as kb:
        await kb.add(str(corpus), progress=progress)
        assert ("start", "extraction", 2) in progress.events
        assert progress.events.count(("advance", "extraction", 1)) == 2
        await kb.add_text(CORPUS["mill.md"], uri="text:mill")
        assert scripted.calls == 3
        assert await graph_only(kb, "the Mill") == ["text:mill", "b.md"]


async def test_read_only_and_graphless_drivers(
    tmp_path: Path, corpus_dir: Path, scripted: ScriptedExtractor
) -> None:
    async with await open_kb(tmp_path / "kb.lancedb", graph_config(tmp_path), scripted) as kb:
        await kb.add(str(corpus_dir))
    async with HaikuRAG(tmp_path / "kb.lancedb", graph_config(tmp_path), read_only=True) as kb:
        assert await graph_only(kb, "Ada Lovelace") == ["ada.md", "engine.md"]

    class NoGraph:
        class features:
            graph = False

    assert load_graph(NoGraph()) is None  # type: ignore[arg-type]


async def test_a_newer_graph_format_is_refused_on_open(tmp_path: Path, corpus_dir: Path) -> None:
    config = graph_config(tmp_path)
    async with HaikuRAG(tmp_path / "kb.lancedb", config, create=True) as kb:
        kb.store.save_graph({"format": GRAPH_FORMAT, "version": 99})
    with pytest.raises(StoreError, match=r"upgrade haiku\.rag"):
        await HaikuRAG(tmp_path / "kb.lancedb", config).open()


# the graph itself ------------------------------------------------------------------


def _extraction(data: dict[str, Any]) -> Extraction:
    return Extraction.model_validate(data)


def build(*chunks: tuple[str, str, dict[str, Any]]) -> KnowledgeGraph:
    """A graph from (chunk id, document id, extraction) triples; content hash = chunk id."""
    graph = KnowledgeGraph()
    for chunk_id, document_id, data in chunks:
        graph.extractions[chunk_id] = _extraction(data)
        assert graph.link_chunk(chunk_id, document_id, chunk_id)
    return graph


def test_names_merge_by_case_and_whitespace_and_types_only_upgrade() -> None:
    graph = build(
        ("c1", "d1", {"entities": [entity("Grace  Hopper")]}),
        ("c2", "d1", {"entities": [entity("grace hopper", "PERSON", "Admiral.")]}),
        ("c3", "d2", {"entities": [entity("GRACE HOPPER", "OTHER", "Wrote COBOL.")]}),
        ("c4", "d2", {"entities": [entity("Grace Hopper", "ORGANIZATION")]}),
    )
    info = graph.entity("grace   HOPPER")
    assert info is not None
    assert info.type == "PERSON"  # the first specific type; OTHER never wins back
    assert info.mentions == 4
    assert info.descriptions == ["Admiral.", "Wrote COBOL."]
    assert graph.entity_count == 1
    graph.remove_document("d1")
    assert graph.entity("grace hopper").type == "ORGANIZATION"  # type: ignore[union-attr]
    graph.unlink_chunk("c4")
    assert graph.entity("grace hopper").type == "OTHER"  # type: ignore[union-attr]
    assert graph.entity("nobody") is None


def test_relationships_clamp_dedupe_and_add_missing_endpoints() -> None:
    # Weights outside [0, 1] are clamped by validation already, and again when merged.
    clamped = Extraction.model_validate({"relationships": [relation("A", "B", "uses", 1.7)]})
    assert clamped.relationships[0].weight == 1.0
    graph = build(
        (
            "c1",
            "d",
            {
                "entities": [entity("A", "TECHNOLOGY")],
                "relationships": [
                    relation("A", "B", "depends on", 0.3),
                    relation("a", "b", "DEPENDS-ON", 0.6),
                    relation("A", "a", "self", 1.0),
                    relation(" ", "B", "blank", 1.0),
                    relation("B", "C", "feeds", -2),
                ],
            },
        ),
        ("c2", "d", {"relationships": [relation("A", "B", "depends_on", 0.2)]}),
    )
    assert graph.entity("B") is not None and graph.entity("C") is not None
    assert graph.entity("B").type == "OTHER"  # type: ignore[union-attr]
    edges = {(s, t, k): d for s, t, k, d in graph.graph.edges(keys=True, data=True)}
    assert set(edges) == {("a", "b", "DEPENDS_ON"), ("b", "c", "FEEDS")}
    assert edges["a", "b", "DEPENDS_ON"]["weight"] == 0.6
    assert edges["a", "b", "DEPENDS_ON"]["support"] == {"c1": 0.6, "c2": 0.2}
    assert edges["b", "c", "FEEDS"]["weight"] == 0.0
    graph.unlink_chunk("c1")
    assert graph.graph.edges["a", "b", "DEPENDS_ON"]["weight"] == 0.2
    assert graph.entity("C") is None
    graph.unlink_chunk("c1")  # unknown now: a no-op
    assert not graph.link_chunk("c9", "d", "missing-hash")


def test_helpers() -> None:
    assert normalize_name("  Ada \n Lovelace ") == "ada lovelace"
    assert tokens("Node.js's C++ and GPT-4, U.S.") == ["node.js", "c++", "and", "gpt-4", "u.s"]
    assert relation_type(" works for ") == "WORKS_FOR"
    assert relation_type("---") == "RELATED_TO"


def test_matching_uses_whole_words_and_exact_phrases() -> None:
    graph = build(
        ("c1", "d", {"entities": [entity("Rust"), entity("New York"), entity("The")]}),
        ("c2", "d", {"entities": [entity("Node.js"), entity("C++")]}),
    )
    assert graph.match("is rust fast?") == ["rust"]
    assert graph.match("rusty nails") == []
    assert graph.match("I love NEW   york") == ["new york"]
    assert graph.match("new jersey and york") == []
    assert graph.match("the end") == []  # a stopword never names an entity
    assert graph.match("node.js's event loop vs c++") == ["c++", "node.js"]
    longer = build(("c", "d", {"entities": [entity("New York Times"), entity("York")]}))
    assert longer.match("the new york times in york") == ["new york times", "york"]
    assert longer.match("new york times") == ["new york times"]
    assert KnowledgeGraph().match("anything") == []


def test_scores_use_edge_weights_and_query_relevance() -> None:
    graph = build(
        (
            "c1",
            "d1",
            {
                "entities": [entity("Acme", "ORGANIZATION")],
                "relationships": [
                    relation("Acme", "Jane Doe", "founded by", 0.9),
                    relation("Acme", "Widget", "makes", 0.9),
                    relation("Acme", "Ghost", "weak", 0.0),
                ],
            },
        ),
        ("c2", "d2", {"entities": [entity("Jane Doe", "PERSON", "The founder of Acme.")]}),
        ("c3", "d3", {"entities": [entity("Widget", "TECHNOLOGY", "A gadget.")]}),
        ("c4", "d4", {"entities": [entity("Ghost")]}),
    )
    scores = graph.entity_scores("Who is the founder of Acme?", hops=1)
    assert scores["acme"] > scores["jane doe"] > scores["widget"]
    assert "ghost" not in scores  # a zero-weight edge carries nothing
    # c2 says who founded Acme: what it says about its entity matches the query best.
    assert graph.rank_chunks("founder of Acme", hops=1) == ["c2", "c1", "c3"]
    assert graph.rank_chunks("founder of Acme", hops=1, max_entities=1) == ["c1"]
    assert graph.rank_chunks("founder of Acme", hops=1, document_ids={"d2", "d3"}) == [
        "c2",
        "c3",
    ]
    assert graph.rank_chunks("nothing named here", hops=3) == []
    assert graph.entity_scores("acme", hops=0) == {"acme": 2.0}


def test_payload_round_trip_and_damage() -> None:
    graph = build(
        ("c1", "d1", FACTS["Ada Lovelace wrote"]),  # type: ignore[arg-type]
        ("c2", "d2", FACTS["Analytical Engine was"]),  # type: ignore[arg-type]
    )
    graph.documents = {"d1": "x", "d2": "y"}
    payload = graph.to_payload()
    assert payload["format"] == GRAPH_FORMAT and payload["version"] == 1
    again = KnowledgeGraph.from_payload(payload)
    assert again.to_payload() == payload
    assert again.stats() == graph.stats()
    assert again.entity("Charles Babbage").type == "PERSON"  # type: ignore[union-attr]
    stats = graph.stats(top=1)
    assert [info.name for info in stats.top] == ["Charles Babbage"]
    assert (stats.entities, stats.relationships, stats.chunks, stats.documents) == (3, 2, 2, 2)


@pytest.mark.parametrize(
    "payload",
    [
        ["not", "a", "mapping"],
        {"format": "something-else"},
        {"format": GRAPH_FORMAT, "version": 1, "extractions": {"h": {"entities": "oops"}}},
        {"format": GRAPH_FORMAT, "version": 1, "chunks": {"c": "not-a-pair"}},
    ],
)
def test_a_damaged_payload_is_dropped_with_a_warning(
    payload: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        graph = KnowledgeGraph.from_payload(payload, "kb.lancedb")
    assert graph.empty and graph.extractions == {}
    assert "kb.lancedb" in caplog.text


def test_a_newer_or_unversioned_payload_is_refused() -> None:
    with pytest.raises(StoreError, match=r"newer than this haiku\.rag reads"):
        KnowledgeGraph.from_payload({"format": GRAPH_FORMAT, "version": 2})
    with pytest.raises(StoreError):
        KnowledgeGraph.from_payload({"format": GRAPH_FORMAT})


# the signal and the update, against a fake store ---------------------------------------


class FakeStore:
    """Only what the graph code touches: chunks by document, hashes, graph payload."""

    path = "fake"

    class features:
        graph = True

    def __init__(self, documents: dict[str, list[str]]) -> None:
        from haiku.rag.documents import chunk_id_for, document_id_for, sha256_hex

        self.uris = {document_id_for(uri): uri for uri in documents}
        self.chunks: dict[str, list[Chunk]] = {}
        self.hashes: dict[str, str] = {}
        for uri, texts in documents.items():
            doc_id = document_id_for(uri)
            self.chunks[doc_id] = [
                Chunk(id=chunk_id_for(doc_id, i, t), document_id=doc_id, order=i, content=t)
                for i, t in enumerate(texts)
            ]
            self.hashes[uri] = sha256_hex("".join(texts))
        self.saved: list[dict[str, Any]] = []
        self.deleted: set[str] = set()

    def document_hashes(self) -> dict[str, str]:
        return dict(self.hashes)

    def document_chunks(self, document_id: str) -> list[Chunk]:
        return list(self.chunks[document_id])

    def get_chunks(self, ids: Sequence[str]) -> list[Chunk]:
        every = {c.id: c for cs in self.chunks.values() for c in cs}
        return [every[i] for i in ids if i in every and i not in self.deleted]

    def save_graph(self, data: dict[str, Any]) -> None:
        self.saved.append(data)

    def load_graph(self) -> dict[str, Any] | None:
        return self.saved[-1] if self.saved else None


async def test_signal_skips_chunks_the_store_no_longer_holds() -> None:
    store = FakeStore({"a": ["Ada Lovelace wrote it", "Ada again"], "b": ["Ada Lovelace wrote"]})
    graph = KnowledgeGraph()
    extractor = ChunkExtractor(ScriptedExtractor({"Ada": {"entities": [entity("Ada")]}}).model())
    await update_graph(store, graph, extractor)  # type: ignore[arg-type]
    ranked = graph.rank_chunks("ada")
    assert len(ranked) == 3
    signal = GraphSignal(store, graph, hops=0, max_entities=5)  # type: ignore[arg-type]
    store.deleted = {ranked[0]}
    assert await signal.rank(Query("ada"), 1, None) == [ranked[1]]
    assert await signal.rank(Query("ada"), 5, None) == ranked[1:]
    assert await signal.rank(Query("nobody"), 5, None) == []
    assert (signal.name, signal.needs_vector) == ("graph", False)


async def test_update_dedupes_identical_text_and_reports() -> None:
    scripted = ScriptedExtractor({"same": {"entities": [entity("Same")]}})
    store = FakeStore({"a": ["same text"], "b": ["same text"], "c": ["other"]})
    graph = KnowledgeGraph()
    update = await update_graph(store, graph, ChunkExtractor(scripted.model()))  # type: ignore[arg-type]
    assert scripted.calls == 2  # "same text" once, "other" once
    assert (update.extracted, update.skipped, update.reused) == (2, 0, 1)
    assert graph.entity("same").mentions == 2  # type: ignore[union-attr]
    assert len(store.saved) == 1
    again = await update_graph(store, graph, ChunkExtractor(scripted.model()))  # type: ignore[arg-type]
    assert not again.changed and len(store.saved) == 1


async def test_update_without_extractor_relinks_known_documents_from_the_cache() -> None:
    scripted = ScriptedExtractor({"v1": {"entities": [entity("One")]}})
    store = FakeStore({"a": ["v1 text"], "b": ["v1 other"]})
    graph = KnowledgeGraph()
    await update_graph(store, graph, ChunkExtractor(scripted.model()))  # type: ignore[arg-type]
    assert len(graph.documents) == 2
    # Document b changes to text the cache has never seen, with no extractor at hand.
    changed = FakeStore({"a": ["v1 text"], "b": ["v2 text"]})
    update = await update_graph(changed, graph, None)  # type: ignore[arg-type]
    assert update.changed and update.extracted == 0
    assert list(graph.documents) == [next(iter(changed.uris))]  # b is no longer "done"
    # Later, with an extractor, b is extracted (it is stale), a is not.
    scripted.calls = 0
    await update_graph(changed, graph, ChunkExtractor(scripted.model()))  # type: ignore[arg-type]
    assert scripted.calls == 1 and len(graph.documents) == 2
    # A document the graph never knew is ignored without an extractor.
    newer = FakeStore({"a": ["v1 text"], "b": ["v2 text"], "c": ["v1 new"]})
    assert not (await update_graph(newer, graph, None)).changed  # type: ignore[arg-type]


async def test_an_extraction_failure_keeps_the_finished_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from haiku.rag.errors import ExtractionError
    from haiku.rag.retrieval import graph as graph_module

    monkeypatch.setattr(graph_module, "CHECKPOINT_CHUNKS", 2)
    texts = [f"fact {i}" for i in range(5)]
    store = FakeStore({"a": texts})
    done: list[str] = []

    class Flaky(ChunkExtractor):
        async def extract_chunk(self, chunk: Chunk) -> Extraction | None:
            if chunk.content == "fact 4":
                raise ExtractionError("provider down")
            done.append(chunk.content)
            return Extraction(entities=[{"name": chunk.content}])  # type: ignore[list-item]

    graph = KnowledgeGraph()
    with pytest.raises(ExtractionError):
        await update_graph(store, graph, Flaky("test", concurrency=1))  # type: ignore[arg-type]
    # Checkpoints after each batch of 2, and once more on failure: nothing finished is lost.
    assert len(store.saved) == 3
    assert len(store.saved[-1]["extractions"]) == 4
    assert graph.documents == {}  # the document is not marked done
    calls: list[str] = []

    class Working(ChunkExtractor):
        async def extract_chunk(self, chunk: Chunk) -> Extraction | None:
            calls.append(chunk.content)
            return Extraction()

    await update_graph(store, graph, Working("test"))  # type: ignore[arg-type]
    assert calls == ["fact 4"]
    assert graph.entity_count == 4


def test_entity_type_is_lenient() -> None:
    assert (
        Extraction.model_validate(
            {"entities": [{"name": "x", "type": "person"}, {"name": "y", "type": "gadget"}]}
        )
        .entities[1]
        .type
        is EntityType.OTHER
    )


async def test_document_filter_through_the_signal(
    tmp_path: Path, corpus_dir: Path, scripted: ScriptedExtractor
) -> None:
    async with await open_kb(tmp_path / "kb.lancedb", graph_config(tmp_path), scripted) as kb:
        await kb.add(str(corpus_dir))
        results = await kb.search("Ada Lovelace", filter="engine")
        assert uris(results) == ["engine.md"]
        assert results[0].signal_ranks.get("graph") == 1


# the command line --------------------------------------------------------------------


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`haiku-rag` on tmp_path/kb.lancedb with the deterministic embedder and no extractor."""
    import yaml
    from typer.testing import CliRunner

    from haiku.rag.cli import app

    config = tmp_path / "haiku.rag.yaml"
    config.write_text(yaml.safe_dump({"embeddings": {"model": "hash:v1", "dimension": 256}}))
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(config))
    monkeypatch.setenv("HAIKU_RAG_DB", str(tmp_path / "kb.lancedb"))
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args), catch_exceptions=False)


def test_cli_graph_and_search_explain(
    cli: Any, tmp_path: Path, corpus_dir: Path, scripted: ScriptedExtractor
) -> None:
    import asyncio
    import json

    empty = cli("graph")
    assert empty.exit_code == 1  # no store yet: one clear error line
    cli("add", str(corpus_dir))
    result = cli("graph")
    assert result.exit_code == 0 and "No knowledge graph yet" in result.stdout
    assert "graph.extractor_model" in result.stdout

    async def build() -> None:
        async with await open_kb(tmp_path / "kb.lancedb", graph_config(tmp_path), scripted) as kb:
            await kb.rebuild()

    asyncio.run(build())
    result = cli("graph", "--top", "2")
    assert result.exit_code == 0, result.output
    assert "4 entities, 3 relationships, from 4 chunks of 4 documents" in result.stdout
    assert "Analytical Engine" in result.stdout and "Charles Babbage" in result.stdout
    assert "Ada Lovelace" not in result.stdout  # only the top 2
    data = json.loads(cli("graph", "--json", "-n", "1").stdout)
    assert data["entities"] == 4 and len(data["top"]) == 1

    result = cli("search", "Ada Lovelace", "--explain", "-k", "2")
    assert result.exit_code == 0, result.output
    assert "signal ranks" in result.stdout
    assert "graph 1" in result.stdout and "vector 1" in result.stdout
    plain = cli("search", "Ada Lovelace", "-k", "2")
    assert "signal ranks" not in plain.stdout
    info = cli("info")
    assert "vector, bm25, graph" in info.stdout
    assert "4 entities, 3 relationships" in info.stdout


def test_cli_graph_on_a_driver_without_graphs(cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_graph(self: HaikuRAG, top: int = 10) -> None:
        return None

    monkeypatch.setattr(HaikuRAG, "graph_stats", no_graph)
    monkeypatch.setattr(HaikuRAG, "open", _noop_open)
    result = cli("graph")
    assert result.exit_code == 1
    assert "keeps no knowledge graph" in result.output


async def _noop_open(self: HaikuRAG) -> HaikuRAG:
    return self
