"""One behaviour, every writable driver: the retriever must not know which store it talks to.

Each test runs against lancedb, yaml and duckdb (a driver whose module does not
exist yet is skipped, so a new driver is picked up as soon as it lands), first at
the Store protocol level with hand-made vectors, then through `HaikuRAG` with
the deterministic `hash:v1` embedder. Rankings are compared chunk id by chunk id
with the reference driver (lancedb) on the same data, and vector rankings also
with an exact numpy oracle.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig
from haiku.rag.documents import Chunk, Document, chunk_id_for
from haiku.rag.embeddings import EmbeddingService
from haiku.rag.errors import ReadOnlyError, StoreError, StoreNotFoundError
from haiku.rag.store import DRIVERS, driver_class
from haiku.rag.store.base import Store, StoreSettings

WRITABLE = ("lancedb", "yaml", "duckdb")
REFERENCE = "lancedb"
SUFFIX = {"lancedb": ".lancedb", "yaml": ".yaml", "duckdb": ".duckdb"}
DIM = 16
WHEN = datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)

CRASH_POINTS: dict[str, tuple[str, str]] = {
    # chunks are committed, documents not yet: the transaction must roll back
    "lancedb": ("haiku.rag.store.lancedb:LanceDBStore", "_merge_documents"),
    # the temp file is half written: it must never replace the store
    "yaml": ("haiku.rag.store.yaml", "_chunk_item"),
    # rows replaced inside the open transaction, not yet committed
    "duckdb": ("haiku.rag.store.duckdb", "_set_meta"),
}
"""Per driver, a function its `write` calls part-way through; the tests make it raise."""


KNOWN_GAPS: dict[tuple[str, str], str] = {}
"""Conformance failures of other drivers, reported to their authors. Strict xfail: the
marker must be removed (the test then passes) once the driver is fixed."""


def known_gap(request: pytest.FixtureRequest, what: str, driver: str) -> None:
    reason = KNOWN_GAPS.get((what, driver))
    if reason is not None:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))


def _module_exists(name: str) -> bool:
    spec = DRIVERS.get(name)
    if spec is None:
        return False
    try:
        return importlib.util.find_spec(spec.partition(":")[0]) is not None
    except ModuleNotFoundError:  # pragma: no cover - parent package missing
        return False


def _require(name: str) -> None:
    if not _module_exists(name):
        pytest.skip(f"the {name} driver is not written yet")


@pytest.fixture(params=WRITABLE)
def driver(request: pytest.FixtureRequest) -> str:
    _require(request.param)
    return request.param


def store_path(root: Path, driver: str, name: str = "kb") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return root / f"{name}{SUFFIX[driver]}"


def make_settings(driver: str, dim: int = DIM) -> StoreSettings:
    return StoreSettings(
        driver=driver,
        embedding_model="test:fixed",
        embedding_dim=dim,
        chunk_size=400,
        chunk_overlap=20,
    )


def create(driver: str, path: Path, dim: int = DIM) -> Store:
    return driver_class(driver).create(str(path), make_settings(driver, dim))


def reopen(driver: str, path: Path, *, read_only: bool = False) -> Store:
    return driver_class(driver).open(str(path), read_only=read_only)


# -- a small corpus with hand-made vectors -------------------------------------------

TEXTS: dict[str, list[str]] = {
    "file:///docs/lancedb.md": [
        "LanceDB is an embedded vector database built on the Lance columnar format.",
        "It supports IVF_PQ vector indexes and native full-text search over columns.",
    ],
    "file:///docs/tantivy.md": [
        "Tantivy is a full-text search engine library written in Rust.",
        "Tantivy ranks documents with BM25, like Apache Lucene does for Java.",
        "Indexes are split into segments that merge in the background.",
    ],
    "file:///cooking/pasta.md": [
        "Boil salted water, add the spaghetti and cook for nine minutes.",
        "Toss the pasta with olive oil, garlic and chili; serve with parmesan.",
    ],
    "file:///cooking/bread.txt": [
        "Sourdough bread needs a lively starter, flour, water and salt.",
        "Bake the bread at 250 degrees with steam for the first twenty minutes.",
        "Let the loaf cool for an hour before cutting: the crumb is still setting.",
    ],
    "file:///notes/rrf.md": [
        "Reciprocal Rank Fusion merges ranked lists from several search engines.",
        "Each list adds weight over k plus rank to a document's fused score.",
    ],
    "file:///notes/duckdb.md": [
        "DuckDB is an in-process analytical database with a vector search extension.",
        "Its full-text search extension ranks rows with BM25 as well.",
    ],
}
KEYWORD_QUERIES = [
    "BM25",
    "bread water salt",
    "vector database search",
    "full-text search engine",
    "minutes",
    'AND "quoted" (OR) -minus: field:value [range] ~fuzzy*',
    "Tantivy's segments",
]


def build_corpus(dim: int = DIM) -> tuple[list[Document], list[Chunk], np.ndarray]:
    """Documents, chunks and seeded unit vectors (no exact ties, the same every run)."""
    rng = np.random.default_rng(7)
    documents: list[Document] = []
    chunks: list[Chunk] = []
    for uri, texts in TEXTS.items():
        document = Document.from_text(
            "\n\n".join(texts), uri=uri, title=uri.rsplit("/", 1)[-1], metadata={"n": len(texts)}
        ).model_copy(update={"created_at": WHEN, "updated_at": WHEN})
        documents.append(document)
        start = 0
        for order, text in enumerate(texts):
            chunks.append(
                Chunk(
                    id=chunk_id_for(document.id, order, text),
                    document_id=document.id,
                    order=order,
                    content=text,
                    start=start,
                    headings=[document.title or ""],
                )
            )
            start += len(text) + 2
    vectors = rng.standard_normal((len(chunks), dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return documents, chunks, vectors


def by_document(
    documents: list[Document], chunks: list[Chunk], vectors: np.ndarray
) -> dict[str, tuple[Document, list[Chunk], np.ndarray]]:
    out = {}
    for document in documents:
        rows = [i for i, chunk in enumerate(chunks) if chunk.document_id == document.id]
        out[document.uri] = (document, [chunks[i] for i in rows], vectors[rows])
    return out


def oracle(
    chunks: list[Chunk],
    vectors: np.ndarray,
    query: np.ndarray,
    limit: int,
    document_ids: set[str] | None = None,
) -> list[str]:
    """Exact cosine ranking, ties by chunk id (what every driver must return)."""
    scores = vectors @ query
    pairs = [
        (chunk.id, float(score))
        for chunk, score in zip(chunks, scores, strict=True)
        if document_ids is None or chunk.document_id in document_ids
    ]
    pairs.sort(key=lambda pair: (-pair[1], pair[0]))
    return [chunk_id for chunk_id, _ in pairs[:limit]]


def ids(ranked: list[tuple[str, float]]) -> list[str]:
    return [chunk_id for chunk_id, _ in ranked]


def query_vectors(dim: int = DIM, count: int = 5) -> np.ndarray:
    rng = np.random.default_rng(11)
    queries = rng.standard_normal((count, dim)).astype(np.float32)
    return queries / np.linalg.norm(queries, axis=1, keepdims=True)


@pytest.fixture
def filled(driver: str, tmp_path: Path) -> Iterator[tuple[Store, Path]]:
    path = store_path(tmp_path / "store", driver)
    store = create(driver, path)
    documents, chunks, vectors = build_corpus()
    store.write(documents, chunks, vectors)
    yield store, path
    store.close()


def crash_point(driver: str) -> tuple[Any, str]:
    target, attribute = CRASH_POINTS[driver]
    module_name, _, class_name = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    if class_name:
        owner = getattr(owner, class_name)
    if not hasattr(owner, attribute):  # pragma: no cover - the driver changed shape
        pytest.fail(f"crash point {target}.{attribute} is gone; update CRASH_POINTS")
    return owner, attribute


def arm_crash(monkeypatch: pytest.MonkeyPatch, driver: str, after: int = 1) -> list[int]:
    """Make the driver's crash point raise on its `after`-th call; returns the call count."""
    owner, attribute = crash_point(driver)
    original: Callable[..., Any] = getattr(owner, attribute)
    calls = [0]

    def boom(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] >= after:
            raise RuntimeError("simulated crash mid-write")
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, attribute, boom)
    return calls


def snapshot(store: Store) -> dict[str, Any]:
    """Everything a reader can observe, to compare before and after a failed write."""
    documents = store.list_documents()
    return {
        "hashes": store.document_hashes(),
        "documents": [d.model_dump() for d in documents],
        "chunks": {d.id: [c.model_dump() for c in store.document_chunks(d.id)] for d in documents},
        "counts": (store.count_documents(), store.count_chunks()),
        "vector": ids(store.vector_search(query_vectors()[0], 5)),
        "keyword": ids(store.keyword_search("bread water", 5)),
    }


# -- Store level ------------------------------------------------------------------------


def test_create_open_and_errors(driver: str, tmp_path: Path) -> None:
    path = store_path(tmp_path, driver)
    cls = driver_class(driver)
    with pytest.raises(StoreNotFoundError, match="create"):
        cls.open(str(path))
    store = create(driver, path)
    assert store.driver == driver
    assert store.settings == make_settings(driver)
    assert (store.count_documents(), store.count_chunks()) == (0, 0)
    assert store.list_documents() == []
    assert store.features.writable and store.features.keyword_search and store.features.graph
    store.close()
    with pytest.raises(StoreError):
        create(driver, path)
    again = reopen(driver, path)
    assert again.settings == make_settings(driver)
    assert again.read_only is False
    again.close()
    with pytest.raises(StoreError):
        cls.create(str(store_path(tmp_path, driver, "other")), make_settings("not-" + driver))


def test_write_and_read_back(filled: tuple[Store, Path]) -> None:
    store, _ = filled
    documents, chunks, _ = build_corpus()
    assert store.count_documents() == len(documents)
    assert store.count_chunks() == len(chunks)
    assert store.document_hashes() == {d.uri: d.content_hash for d in documents}
    listed = store.list_documents()
    assert [d.uri for d in listed] == sorted(d.uri for d in documents)
    assert [d.uri for d in store.list_documents(limit=2, offset=1)] == [d.uri for d in listed[1:3]]
    assert store.list_documents(limit=0) == []
    with pytest.raises(ValueError):
        store.list_documents(offset=-1)
    first = documents[0]
    stored = store.get_document(first.id)
    assert stored is not None
    assert stored.model_dump() == first.model_dump()
    assert store.get_document("nope") is None
    batch = store.get_documents([documents[1].id, "nope", first.id, first.id])
    assert sorted(d.id for d in batch) == sorted([documents[1].id, first.id])
    assert {d.id: d.model_dump() for d in batch}[first.id] == first.model_dump()
    assert store.get_documents([]) == []
    wanted = [chunks[4].id, "missing", chunks[0].id]
    assert [c.id for c in store.get_chunks(wanted)] == [chunks[4].id, chunks[0].id]
    assert store.get_chunks([]) == []
    assert store.get_chunks([chunks[2].id])[0].model_dump() == chunks[2].model_dump()
    doc_chunks = store.document_chunks(documents[1].id)
    assert [c.order for c in doc_chunks] == [0, 1, 2]
    assert [c.model_dump() for c in doc_chunks] == [
        c.model_dump() for c in chunks if c.document_id == documents[1].id
    ]
    assert store.document_chunks("nope") == []


def test_replace_document_replaces_its_chunks(filled: tuple[Store, Path]) -> None:
    store, _ = filled
    documents, chunks, vectors = build_corpus()
    bread = by_document(documents, chunks, vectors)["file:///cooking/bread.txt"]
    new_text = ["Rye bread is dense.", "It keeps for a week."]
    new_doc = Document.from_text("\n\n".join(new_text), uri=bread[0].uri, title="Rye")
    new_chunks = [
        Chunk(id=chunk_id_for(new_doc.id, i, t), document_id=new_doc.id, order=i, content=t)
        for i, t in enumerate(new_text)
    ]
    store.write([new_doc], new_chunks, bread[2][:2])
    assert store.count_documents() == len(documents)
    assert store.count_chunks() == len(chunks) - 3 + 2
    assert [c.id for c in store.document_chunks(new_doc.id)] == [c.id for c in new_chunks]
    assert store.get_chunks([c.id for c in bread[1]]) == []
    assert store.document_hashes()[bread[0].uri] == new_doc.content_hash
    stored = store.get_document(new_doc.id)
    assert stored is not None and stored.title == "Rye"
    assert set(ids(store.keyword_search("sourdough", 10))) == set()
    assert ids(store.keyword_search("rye", 10)) == [new_chunks[0].id]
    # a document may be rewritten with no chunks at all
    store.write([new_doc], [], np.zeros((0, DIM), dtype=np.float32))
    assert store.document_chunks(new_doc.id) == []
    assert store.get_document(new_doc.id) is not None


def test_delete_documents(filled: tuple[Store, Path]) -> None:
    store, _ = filled
    documents, chunks, _ = build_corpus()
    gone = [documents[0].id, documents[2].id]
    assert store.delete_documents([*gone, "unknown"]) == 2
    assert store.delete_documents(gone) == 0
    assert store.delete_documents([]) == 0
    assert store.count_documents() == len(documents) - 2
    left = [c for c in chunks if c.document_id not in gone]
    assert store.count_chunks() == len(left)
    assert store.get_chunks([c.id for c in chunks]) == [
        c for c in store.get_chunks([c.id for c in left])
    ]
    for ranked in (store.vector_search(query_vectors()[0], 50), store.keyword_search("the", 50)):
        assert not {chunk_id for chunk_id, _ in ranked} & {
            c.id for c in chunks if c.document_id in gone
        }


def test_vector_search_is_exact_cosine(filled: tuple[Store, Path]) -> None:
    store, _ = filled
    _, chunks, vectors = build_corpus()
    for query in query_vectors():
        ranked = store.vector_search(query, 5)
        assert ids(ranked) == oracle(chunks, vectors, query, 5)
        expected = {c.id: float(v @ query) for c, v in zip(chunks, vectors, strict=True)}
        for chunk_id, score in ranked:
            assert score == pytest.approx(expected[chunk_id], abs=1e-5)
        assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)
    # the nearest neighbour of a stored vector is its own chunk, score ~1
    top = store.vector_search(vectors[3], 1)
    assert top[0][0] == chunks[3].id and top[0][1] == pytest.approx(1.0, abs=1e-5)
    assert len(store.vector_search(query_vectors()[0], 100)) == len(chunks)
    assert store.vector_search(query_vectors()[0], 0) == []


def test_vector_search_filter(filled: tuple[Store, Path]) -> None:
    store, _ = filled
    documents, chunks, vectors = build_corpus()
    allowed = {documents[1].id, documents[4].id}
    for query in query_vectors():
        ranked = store.vector_search(query, 4, document_ids=allowed)
        assert ids(ranked) == oracle(chunks, vectors, query, 4, allowed)
    assert store.vector_search(query_vectors()[0], 4, document_ids=[]) == []
    assert store.vector_search(query_vectors()[0], 4, document_ids=["unknown"]) == []


def test_vector_search_dimension_mismatch(filled: tuple[Store, Path]) -> None:
    store, _ = filled
    with pytest.raises(StoreError, match="dimension"):
        store.vector_search(np.ones(DIM + 1, dtype=np.float32), 3)


def test_keyword_search(filled: tuple[Store, Path]) -> None:
    store, _ = filled
    documents, chunks, _ = build_corpus()
    tantivy_doc = documents[1].id
    top = store.keyword_search("Tantivy", 10)
    assert top and {c.document_id for c in store.get_chunks(ids(top))} == {tantivy_doc}
    assert [s for _, s in top] == sorted((s for _, s in top), reverse=True)
    assert all(score > 0 for _, score in top)
    bread = store.keyword_search("sourdough starter", 3)
    assert ids(bread)[0] == chunks[7].id
    assert ids(store.keyword_search("BAKE", 5))[0] == chunks[8].id  # case-insensitive
    for query in KEYWORD_QUERIES:  # syntax characters are words, never errors
        store.keyword_search(query, 5)
    assert store.keyword_search("", 5) == []
    assert store.keyword_search("   ", 5) == []
    assert store.keyword_search("zyzzyva", 5) == []
    assert store.keyword_search("bread", 0) == []


def test_keyword_search_filter(filled: tuple[Store, Path]) -> None:
    store, _ = filled
    documents, _, _ = build_corpus()
    allowed = {documents[5].id}
    ranked = store.keyword_search("BM25 search", 10, document_ids=allowed)
    assert ranked
    assert {c.document_id for c in store.get_chunks(ids(ranked))} == allowed
    unfiltered = ids(store.keyword_search("BM25 search", 50))
    # the filter selects chunks; it does not reorder them
    assert ids(ranked) == [c for c in unfiltered if c in set(ids(ranked))]
    assert store.keyword_search("BM25", 10, document_ids=[]) == []


def test_reopen_from_disk(
    filled: tuple[Store, Path], driver: str, request: pytest.FixtureRequest
) -> None:
    known_gap(request, "features", driver)
    store, path = filled
    before = snapshot(store)
    store.close()
    again = reopen(driver, path)
    assert snapshot(again) == before
    again.close()
    read_only = reopen(driver, path, read_only=True)
    assert read_only.read_only is True
    # `features` is what the driver can do (the client reads `writable=False` as "this
    # driver is read-only"); the handle's mode is `read_only`.
    assert read_only.features.writable is True
    assert snapshot(read_only) == before
    documents, chunks, vectors = build_corpus()
    with pytest.raises(ReadOnlyError):
        read_only.write(documents[:1], chunks[:2], vectors[:2])
    with pytest.raises(ReadOnlyError):
        read_only.delete_documents([documents[0].id])
    with pytest.raises(ReadOnlyError):
        read_only.save_graph({"nodes": []})
    read_only.close()


def test_write_validation_changes_nothing(filled: tuple[Store, Path]) -> None:
    store, _ = filled
    before = snapshot(store)
    documents, chunks, vectors = build_corpus()
    doc, doc_chunks = documents[0], chunks[:2]
    with pytest.raises(StoreError, match="dimensions"):
        store.write([doc], doc_chunks, np.ones((2, DIM + 3), dtype=np.float32))
    with pytest.raises(StoreError, match="one vector per chunk"):
        store.write([doc], doc_chunks, vectors[:1])
    with pytest.raises(StoreError):
        store.write([doc, doc], doc_chunks, vectors[:2])
    with pytest.raises(StoreError):
        store.write([doc], [doc_chunks[0], doc_chunks[0]], vectors[:2])
    with pytest.raises(StoreError):
        store.write([doc], chunks[:3], vectors[:3])  # chunk 2 belongs to another document
    with pytest.raises(StoreError, match="NaN"):
        store.write([doc], doc_chunks, np.full((2, DIM), np.nan, dtype=np.float32))
    store.write([], [], np.zeros((0, DIM), dtype=np.float32))
    assert snapshot(store) == before


def test_crash_during_write_keeps_previous_state(
    filled: tuple[Store, Path], driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, path = filled
    before = snapshot(store)
    documents, _, vectors = build_corpus()
    new_doc = Document.from_text("Completely new text about bread.", uri=documents[3].uri)
    new_chunks = [
        Chunk(id=chunk_id_for(new_doc.id, i, t), document_id=new_doc.id, order=i, content=t)
        for i, t in enumerate(["Completely new text", "about bread."])
    ]
    extra = Document.from_text("another", uri="file:///extra.md")
    extra_chunk = Chunk(
        id=chunk_id_for(extra.id, 0, "another"), document_id=extra.id, order=0, content="another"
    )
    calls = arm_crash(monkeypatch, driver, after=2 if driver == "yaml" else 1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        store.write([new_doc, extra], [*new_chunks, extra_chunk], vectors[:3])
    assert calls[0] >= 1
    monkeypatch.undo()
    assert snapshot(store) == before
    store.close()
    again = reopen(driver, path)
    assert snapshot(again) == before
    # and the store still takes writes afterwards
    again.write([new_doc], new_chunks, vectors[:2])
    assert again.document_hashes()[new_doc.uri] == new_doc.content_hash
    again.close()
    leftovers = [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_graph_payload_round_trip(driver: str, tmp_path: Path) -> None:
    path = store_path(tmp_path, driver)
    store = create(driver, path)
    assert store.load_graph() is None
    payload = {
        "directed": False,
        "nodes": [{"id": "LanceDB", "type": "software", "chunks": ["a", "b"]}],
        "links": [{"source": "LanceDB", "target": "Tantivy", "weight": 0.5}],
        "note": 'ünïcødé 😀 "quotes" \\ back\nslash',
    }
    store.save_graph(payload)
    assert store.load_graph() == payload
    loaded = store.load_graph()
    assert loaded is not None
    loaded["nodes"].append({"id": "mutated"})  # callers cannot change the stored graph
    assert store.load_graph() == payload
    store.close()
    again = reopen(driver, path)
    assert again.load_graph() == payload
    again.save_graph({"nodes": []})
    assert again.load_graph() == {"nodes": []}
    again.close()
    assert reopen(driver, path, read_only=True).load_graph() == {"nodes": []}


def test_closed_store_refuses_work(driver: str, tmp_path: Path) -> None:
    store = create(driver, store_path(tmp_path, driver))
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.list_documents()


@pytest.mark.parametrize("other", WRITABLE)
def test_reopening_with_another_driver_says_how_to_switch(
    driver: str, other: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if other == driver:
        pytest.skip("same driver")
    _require(other)
    known_gap(request, "switch", other)
    path = store_path(tmp_path, driver)
    create(driver, path).close()
    with pytest.raises(StoreError) as raised:
        driver_class(other).open(str(path))
    assert not isinstance(raised.value, StoreNotFoundError) or driver == "duckdb"
    message = str(raised.value)
    assert driver in message, message  # names the driver that owns the store
    assert "add" in message, message  # and how to switch: a new store, documents re-added


# -- identical rankings across drivers -------------------------------------------------


def rankings(store: Store) -> dict[str, list[str]]:
    documents, _, _ = build_corpus()
    out: dict[str, list[str]] = {}
    for i, query in enumerate(query_vectors()):
        out[f"vector {i}"] = ids(store.vector_search(query, 6))
        out[f"vector {i} filtered"] = ids(
            store.vector_search(query, 3, document_ids={documents[0].id, documents[3].id})
        )
    for query in KEYWORD_QUERIES:
        out[f"bm25 {query}"] = ids(store.keyword_search(query, 6))
        out[f"bm25 {query} filtered"] = ids(
            store.keyword_search(query, 3, document_ids={documents[1].id, documents[5].id})
        )
    return out


def test_rankings_match_reference_driver(
    filled: tuple[Store, Path], driver: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store, _ = filled
    _require(REFERENCE)
    known_gap(request, "bm25", driver)
    reference = create(REFERENCE, store_path(tmp_path / "reference", REFERENCE))
    reference.write(*build_corpus())
    expected = rankings(reference)
    reference.close()
    assert rankings(store) == expected


# -- through HaikuRAG ------------------------------------------------------------------


class EmbedCounter:
    """Counts `embed_documents` calls and texts, across every EmbeddingService."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.texts = 0
        original = EmbeddingService.embed_documents
        counter = self

        async def counted(self: EmbeddingService, texts: Any, *args: Any, **kwargs: Any) -> Any:
            counter.calls += 1
            counter.texts += len(texts)
            return await original(self, texts, *args, **kwargs)

        monkeypatch.setattr(EmbeddingService, "embed_documents", counted)

    def reset(self) -> None:
        self.calls = self.texts = 0


QUERIES = [
    "full-text search engine",
    "how long to cook spaghetti",
    "reciprocal rank fusion",
    "vector database",
    "bread",
]


def kb_path(tmp_path: Path, driver: str, name: str = "kb") -> Path:
    return store_path(tmp_path / f"{name}-{driver}", driver)


async def search_all(kb: HaikuRAG, filter: str | None = None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for query in QUERIES:
        document_ids = await kb.filter_document_ids(filter) if filter else None
        for signals in ({"vector"}, {"bm25"}, None):
            name = "+".join(sorted(signals)) if signals else "hybrid"
            results = await kb.retriever.search(
                query, top_k=5, document_ids=document_ids, signals=signals
            )
            out[f"{name}: {query}"] = [r.chunk_id for r in results]
    return out


async def test_client_add_update_delete(
    driver: str,
    tmp_path: Path,
    config: AppConfig,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counter = EmbedCounter(monkeypatch)
    path = kb_path(tmp_path, driver)
    async with HaikuRAG(path, config, create=True, driver=driver) as kb:
        report = await kb.add(str(corpus))
        assert len(report.added) == 5 and not report.failed
        assert counter.texts == report.chunks_embedded > 0
        assert (await kb.info()).driver == driver
        counter.reset()
        again = await kb.add(str(corpus))
        assert len(again.unchanged) == 5 and not again.added and not again.updated
        assert counter.calls == 0 and again.chunks_embedded == 0
        pasta = corpus / "cooking" / "pasta.md"
        pasta.write_text("# Pasta\n\nCarbonara: eggs, pecorino, guanciale and pepper.\n")
        changed = await kb.add(str(corpus))
        assert changed.updated == [pasta.resolve().as_uri()]
        assert counter.texts == changed.chunks_embedded == 1
        hits = await kb.search("carbonara guanciale", top_k=1)
        assert hits[0].document_uri == pasta.resolve().as_uri()
        assert "Carbonara" in hits[0].content
        (corpus / "notes" / "rrf.md").unlink()
        pruned = await kb.add(str(corpus))
        assert len(pruned.deleted) == 1 and kb.store.count_documents() == 4
        assert await kb.delete_document(str(corpus / "tantivy.md")) is True
        assert await kb.delete_document("never-added") is False
        assert kb.store.count_documents() == 3
        assert not await kb.search("Tantivy Lucene", top_k=5, filter="tantivy")
    (corpus / "tantivy.md").unlink()
    async with HaikuRAG(path, config, driver=driver) as kb:  # reopen from disk
        assert kb.store.count_documents() == 3
        counter.reset()
        report = await kb.add(str(corpus))
        assert len(report.unchanged) == 3 and report.chunks_embedded == 0
        assert counter.calls == 0


async def test_client_rankings_identical_across_drivers(
    driver: str, tmp_path: Path, config: AppConfig, corpus: Path
) -> None:
    _require(REFERENCE)
    expected: dict[str, list[str]] = {}
    expected_filtered: dict[str, list[str]] = {}
    async with HaikuRAG(
        kb_path(tmp_path, REFERENCE, "reference"), config, create=True, driver=REFERENCE
    ) as ref:
        await ref.add(str(corpus))
        expected = await search_all(ref)
        expected_filtered = await search_all(ref, filter="cooking")
    async with HaikuRAG(kb_path(tmp_path, driver), config, create=True, driver=driver) as kb:
        await kb.add(str(corpus))
        got = await search_all(kb)
        assert got == expected
        assert await search_all(kb, filter="cooking") == expected_filtered
        for results in (await kb.search("bread", top_k=5, filter="cooking"),):
            assert results and all("/cooking/" in r.document_uri for r in results)
        # vector ranking also equals the exact oracle over the stored chunks
        vector = await kb.embedder.embed_query("vector database")
        chunk_ids = [
            c.id for d in kb.store.list_documents() for c in kb.store.document_chunks(d.id)
        ]
        chunks = kb.store.get_chunks(chunk_ids)
        stored = await kb.embedder.embed_documents([c.content for c in chunks])
        assert got["vector: vector database"] == oracle(chunks, stored, vector, 5)
    async with HaikuRAG(kb_path(tmp_path, driver), config, driver=driver) as kb:
        assert await search_all(kb) == expected  # reopened from disk: same answers


async def test_client_dimension_mismatch(
    driver: str, tmp_path: Path, config: AppConfig, corpus: Path
) -> None:
    path = kb_path(tmp_path, driver)
    async with HaikuRAG(path, config, create=True, driver=driver) as kb:
        await kb.add(str(corpus))
        before = kb.store.document_hashes()
    wrong = config.model_copy(deep=True)
    wrong.embeddings.dimension = 128
    with pytest.raises(StoreError, match="128"):
        async with HaikuRAG(path, wrong, driver=driver):
            pass  # pragma: no cover
    async with HaikuRAG(path, config, driver=driver) as kb:
        assert kb.store.document_hashes() == before


async def test_client_crash_during_add_keeps_previous_state(
    driver: str,
    tmp_path: Path,
    config: AppConfig,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = kb_path(tmp_path, driver)
    async with HaikuRAG(path, config, create=True, driver=driver) as kb:
        await kb.add(str(corpus))
        before = snapshot_client(kb.store)
        expected = await search_all(kb)
    for name in ("lancedb.md", "cooking/bread.txt"):
        (corpus / name).write_text(f"# Changed\n\n{name} now says something else entirely.\n")
    (corpus / "new.md").write_text("# New\n\nA brand new document.\n")
    async with HaikuRAG(path, config, driver=driver) as kb:
        arm_crash(monkeypatch, driver, after=2 if driver == "yaml" else 1)
        with pytest.raises(RuntimeError, match="simulated crash"):
            await kb.add(str(corpus))
        monkeypatch.undo()
        assert snapshot_client(kb.store) == before
    async with HaikuRAG(path, config, driver=driver) as kb:
        assert snapshot_client(kb.store) == before
        assert await search_all(kb) == expected
        report = await kb.add(str(corpus))  # the interrupted add can simply be run again
        assert len(report.updated) == 2 and len(report.added) == 1


def snapshot_client(store: Store) -> dict[str, Any]:
    documents = store.list_documents()
    return {
        "hashes": store.document_hashes(),
        "chunks": {d.uri: [c.id for c in store.document_chunks(d.id)] for d in documents},
    }
