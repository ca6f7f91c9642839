"""The LanceDB driver against a real LanceDB directory in tmp_path."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pytest

from haiku.rag.documents import Chunk, Document, chunk_id_for
from haiku.rag.errors import ReadOnlyError, StoreError, StoreNotFoundError
from haiku.rag.store.base import Store, StoreSettings
from haiku.rag.store.lancedb import LanceDBStore, delete_store

DIM = 4


def settings(dim: int = DIM) -> StoreSettings:
    return StoreSettings(
        driver="lancedb",
        embedding_model="test:fake",
        embedding_dim=dim,
        chunk_size=200,
        chunk_overlap=10,
    )


def unit(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def document(uri: str, texts: list[str], **extra) -> tuple[Document, list[Chunk]]:
    doc = Document.from_text("\n\n".join(texts), uri=uri, **extra)
    chunks = [
        Chunk(
            id=chunk_id_for(doc.id, i, text),
            document_id=doc.id,
            order=i,
            content=text,
            start=i * 10,
            headings=[f"H{i}"],
        )
        for i, text in enumerate(texts)
    ]
    return doc, chunks


def write(store: LanceDBStore, uri: str, texts: list[str], vectors: list[np.ndarray]):
    doc, chunks = document(uri, texts)
    store.write([doc], chunks, np.stack(vectors) if vectors else np.zeros((0, DIM)))
    return doc, chunks


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "kb.lancedb"


@pytest.fixture
def store(path: Path):
    store = LanceDBStore.create(path, settings())
    yield store
    store.close()


@pytest.fixture
def corpus(store: LanceDBStore):
    """Three documents whose vectors point along different axes."""
    a = write(
        store,
        "a.md",
        ["apples and pears grow in orchards", "the zygomorphic flower of the orchid"],
        [unit(1, 0, 0, 0), unit(1, 1, 0, 0)],
    )
    b = write(
        store,
        "b.md",
        ["bananas are yellow", "pears are green"],
        [unit(0, 1, 0, 0), unit(0, 0, 1, 0)],
    )
    c = write(store, "c.md", ["cherries are red fruit"], [unit(0, 0, 0, 1)])
    return a, b, c


# lifecycle -------------------------------------------------------------------


def test_create_open_settings_round_trip(path: Path) -> None:
    created = LanceDBStore.create(path, settings())
    assert isinstance(created, Store)
    assert created.driver == "lancedb"
    assert created.features.writable and created.features.keyword_search
    created.close()
    with LanceDBStore.open(path) as opened:
        assert opened.settings == settings()
        assert opened.path == str(path)
        assert not opened.read_only
        assert "writable" in repr(opened)
        assert opened.count_documents() == 0 and opened.count_chunks() == 0
        assert opened.list_documents() == []
        assert opened.load_graph() is None


def test_create_refuses_existing_store_and_foreign_directories(path: Path, tmp_path: Path) -> None:
    LanceDBStore.create(path, settings()).close()
    with pytest.raises(StoreError, match="already exists"):
        LanceDBStore.create(path, settings())
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"")
    with pytest.raises(StoreError, match="not empty"):
        LanceDBStore.create(foreign, settings())
    a_file = tmp_path / "file.lancedb"
    a_file.write_text("x")
    with pytest.raises(StoreError, match="not a directory"):
        LanceDBStore.create(a_file, settings())
    with pytest.raises(StoreError, match="driver='lancedb'"):
        LanceDBStore.create(
            tmp_path / "y.lancedb", settings().model_copy(update={"driver": "yaml"})
        )


def test_create_over_an_interrupted_create(path: Path) -> None:
    """Settings are written last, so table directories without them are leftovers."""
    db = lancedb.connect(path)
    db.create_table("chunks", schema=pa.schema([("id", pa.string())]))
    with LanceDBStore.create(path, settings()) as store:
        assert store.count_chunks() == 0


def test_open_missing_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match=r"haiku-rag add.*create=True"):
        LanceDBStore.open(tmp_path / "missing.lancedb")
    assert not (tmp_path / "missing.lancedb").exists()


def test_open_a_directory_that_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(StoreError, match=r"not a haiku\.rag LanceDB store") as caught:
        LanceDBStore.open(tmp_path / "plain")
    assert not isinstance(caught.value, StoreNotFoundError)


def _rewrite_settings(path: Path, value: str) -> None:
    table = lancedb.connect(path).open_table("settings")
    table.update(values={"value": value})


def test_open_rejects_damaged_or_foreign_settings(path: Path) -> None:
    LanceDBStore.create(path, settings()).close()
    _rewrite_settings(path, "{not json")
    with pytest.raises(StoreError, match="damaged"):
        LanceDBStore.open(path)
    _rewrite_settings(path, settings().model_copy(update={"driver": "yaml"}).model_dump_json())
    with pytest.raises(StoreError, match="records driver 'yaml'"):
        LanceDBStore.open(path)
    newer = settings().model_copy(update={"format_version": 99}).model_dump_json()
    _rewrite_settings(path, newer)
    with pytest.raises(StoreError, match=r"upgrade haiku\.rag"):
        LanceDBStore.open(path)


def test_close_releases_and_then_refuses(path: Path) -> None:
    store = LanceDBStore.create(path, settings())
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.count_documents()
    with pytest.raises(StoreError, match="closed"):
        store.write([], [], np.zeros((0, DIM)))


def test_delete_store(path: Path, tmp_path: Path) -> None:
    LanceDBStore.create(path, settings()).close()
    delete_store(path)
    assert not path.exists()
    with pytest.raises(StoreNotFoundError):
        delete_store(path)
    (tmp_path / "precious").mkdir()
    with pytest.raises(StoreError, match="refusing"):
        delete_store(tmp_path / "precious")
    assert (tmp_path / "precious").exists()


# documents and chunks ----------------------------------------------------------


def test_write_and_read_back(store: LanceDBStore) -> None:
    created = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    doc, chunks = document(
        "docs/a.md",
        ["first chunk", "second chunk", "third chunk"],
        title="A",
        metadata={"tags": ["x", "ü"], "when": created, "n": 3},
    )
    doc = doc.model_copy(update={"created_at": created})
    store.write([doc], chunks, np.stack([unit(1, 0, 0, 0), unit(0, 1, 0, 0), unit(0, 0, 1, 0)]))

    back = store.get_document(doc.id)
    assert back is not None
    assert back.model_dump(exclude={"metadata"}) == doc.model_dump(exclude={"metadata"})
    assert back.metadata == {"tags": ["x", "ü"], "when": "2024-01-02T03:04:05.678901Z", "n": 3}
    assert store.get_document("nope") is None
    assert store.document_hashes() == {"docs/a.md": doc.content_hash}
    assert store.document_chunks(doc.id) == chunks
    assert store.document_chunks("nope") == []
    ids = [c.id for c in chunks]
    asked = [ids[2], "missing", ids[0], ids[2]]
    assert [c.id for c in store.get_chunks(asked)] == [ids[2], ids[0], ids[2]]
    assert store.get_chunks([]) == []
    assert store.get_chunks([ids[1]])[0].headings == ["H1"]


def test_replace_with_fewer_chunks_removes_the_old_ones(store: LanceDBStore) -> None:
    _, old = write(store, "a.md", ["alpha one", "alpha two", "alpha three"], [unit(1, 0, 0, 0)] * 3)
    other, other_chunks = write(store, "b.md", ["beta"], [unit(0, 1, 0, 0)])
    new_doc, new = write(store, "a.md", ["omega"], [unit(0, 0, 1, 0)])

    assert store.count_documents() == 2
    assert store.count_chunks() == 2
    assert store.get_chunks([c.id for c in old]) == []
    assert store.document_chunks(new_doc.id) == new
    assert store.document_chunks(other.id) == other_chunks
    assert store.keyword_search("alpha", 10) == []
    assert [cid for cid, _ in store.keyword_search("omega", 10)] == [new[0].id]
    assert {cid for cid, _ in store.vector_search(unit(1, 0, 0, 0), 10)} == {
        new[0].id,
        other_chunks[0].id,
    }


def test_a_document_with_no_chunks_drops_its_old_chunks(store: LanceDBStore) -> None:
    doc, _ = write(store, "a.md", ["some text"], [unit(1, 0, 0, 0)])
    empty = doc.model_copy(update={"content": "", "content_hash": "e"})
    store.write([empty], [], np.zeros((0, DIM), dtype=np.float32))
    store.write([empty], [], np.array([]))
    assert store.count_chunks() == 0
    assert store.get_document(doc.id).content_hash == "e"


def test_empty_write_is_a_no_op(store: LanceDBStore) -> None:
    store.write([], [], np.zeros((0, DIM)))
    assert store.count_documents() == 0


def test_delete_documents(store: LanceDBStore, corpus) -> None:
    (a, a_chunks), (b, _), (c, _) = corpus
    assert store.delete_documents([a.id, a.id, "unknown"]) == 1
    assert store.delete_documents([]) == 0
    assert store.delete_documents(["unknown"]) == 0
    assert store.count_documents() == 2
    assert store.count_chunks() == 3
    assert store.get_chunks([ch.id for ch in a_chunks]) == []
    assert store.get_document(a.id) is None
    assert store.delete_documents({b.id, c.id}) == 2
    assert store.count_chunks() == 0


def test_counts_and_listing_pages(store: LanceDBStore, corpus) -> None:
    assert store.count_documents() == 3
    assert store.count_chunks() == 5
    assert [d.uri for d in store.list_documents()] == ["a.md", "b.md", "c.md"]
    assert [d.uri for d in store.list_documents(limit=2)] == ["a.md", "b.md"]
    assert [d.uri for d in store.list_documents(limit=2, offset=2)] == ["c.md"]
    assert [d.uri for d in store.list_documents(offset=1)] == ["b.md", "c.md"]
    assert store.list_documents(limit=0) == []
    assert store.list_documents(offset=9) == []
    assert store.list_documents(limit=1)[0].content.startswith("apples")
    with pytest.raises(ValueError, match="negative"):
        store.list_documents(offset=-1)


@pytest.mark.parametrize(
    ("vectors", "message"),
    [
        (np.zeros((1, DIM)), "one vector per chunk"),
        (np.zeros(DIM), "one vector per chunk"),
        (np.zeros((2, DIM + 1)), r"5 dimensions.*test:fake \(4\)"),
        (np.full((2, DIM), np.nan), "NaN"),
    ],
)
def test_write_rejects_bad_vectors_and_changes_nothing(
    store: LanceDBStore, vectors: np.ndarray, message: str
) -> None:
    doc, chunks = document("a.md", ["x", "y"])
    with pytest.raises(StoreError, match=message):
        store.write([doc], chunks, vectors)
    assert store.count_documents() == 0 and store.count_chunks() == 0


def test_write_rejects_inconsistent_batches(store: LanceDBStore) -> None:
    doc, chunks = document("a.md", ["x", "y"])
    vectors = np.stack([unit(1, 0, 0, 0)] * 2)
    with pytest.raises(StoreError, match="same document twice"):
        store.write([doc, doc], chunks, vectors)
    with pytest.raises(StoreError, match="same chunk id twice"):
        store.write([doc], [chunks[0], chunks[0]], vectors)
    with pytest.raises(StoreError, match="not in this write"):
        store.write([], chunks, vectors)


# search ----------------------------------------------------------------------


def test_vector_search_orders_by_cosine_similarity(store: LanceDBStore, corpus) -> None:
    (_, a_chunks), (_, b_chunks), _ = corpus
    query = unit(1, 0.2, 0, 0)
    hits = store.vector_search(query, 3)
    assert [cid for cid, _ in hits] == [a_chunks[0].id, a_chunks[1].id, b_chunks[0].id]
    expected = [float(query @ unit(1, 0, 0, 0)), float(query @ unit(1, 1, 0, 0))]
    assert [score for _, score in hits[:2]] == pytest.approx(expected, abs=1e-5)
    assert hits[0][1] >= hits[1][1] >= hits[2][1]
    assert len(store.vector_search(query, 50)) == 5
    assert store.vector_search(query, 0) == []
    with pytest.raises(StoreError, match="3 dimensions"):
        store.vector_search(np.ones(3), 3)


def test_keyword_search_ranks_the_rare_word_first(store: LanceDBStore, corpus) -> None:
    (_, a_chunks), (_, b_chunks), _ = corpus
    hits = store.keyword_search("zygomorphic pears", 10)
    assert hits[0][0] == a_chunks[1].id
    assert {cid for cid, _ in hits} == {a_chunks[0].id, a_chunks[1].id, b_chunks[1].id}
    assert hits[0][1] > hits[1][1] > 0
    assert store.keyword_search("ZYGOMORPHIC", 10)[0][0] == a_chunks[1].id
    assert store.keyword_search("   ", 10) == []
    assert store.keyword_search("pears", 0) == []


@pytest.mark.parametrize(
    "query",
    [
        '"unclosed quote',
        '"pears are"',
        "pears:green",
        "title:pears",
        "(pears",
        "pears)",
        "pears AND",
        "AND OR NOT",
        "-pears",
        "+pears",
        "pears*",
        "pe?rs",
        "pears~2",
        "pears^3",
        "[a TO z]",
        "{}",
        "o'reilly; DROP TABLE chunks; --",
        "\\",
        "/regex/",
        "''",
    ],
)
def test_keyword_search_survives_query_syntax(store: LanceDBStore, corpus, query: str) -> None:
    hits = store.keyword_search(query, 5)
    assert isinstance(hits, list)
    if "pears" in query:
        assert hits  # the words still count


def test_filters_restrict_both_searches(store: LanceDBStore, corpus) -> None:
    (a, a_chunks), (b, b_chunks), (c, _) = corpus
    only_b = store.vector_search(unit(1, 0, 0, 0), 10, document_ids=[b.id])
    assert {cid for cid, _ in only_b} == {ch.id for ch in b_chunks}
    only_b = store.keyword_search("pears", 10, document_ids={b.id})
    assert [cid for cid, _ in only_b] == [b_chunks[1].id]
    two = store.keyword_search("pears", 10, document_ids=[a.id, c.id])
    assert [cid for cid, _ in two] == [a_chunks[0].id]
    for ids in ([], ["it's \" nothing"]):
        assert store.vector_search(unit(1, 0, 0, 0), 10, document_ids=ids) == []
        assert store.keyword_search("pears", 10, document_ids=ids) == []


def test_new_chunks_are_searchable_at_once_and_folded_into_the_index(
    store: LanceDBStore, corpus
) -> None:
    chunks_table = store._table("chunks")
    assert chunks_table.index_stats("content_idx").num_unindexed_rows == 5
    store.fts_unindexed_limit = 5
    _, fresh = write(store, "d.md", ["quasar light"], [unit(1, 1, 1, 1)])
    assert chunks_table.index_stats("content_idx").num_unindexed_rows == 0
    assert store.keyword_search("quasar", 5)[0][0] == fresh[0].id
    assert store.keyword_search("zygomorphic", 5)


def test_a_failing_index_fold_keeps_the_write(
    store: LanceDBStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store.fts_unindexed_limit = 0

    def broken(**_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(store._table("chunks"), "optimize", broken)
    with caplog.at_level(logging.WARNING, logger="haiku.rag.store.lancedb"):
        _, chunks = write(store, "a.md", ["nebula"], [unit(1, 0, 0, 0)])
    assert "disk full" in caplog.text
    assert store.keyword_search("nebula", 5)[0][0] == chunks[0].id


# read-only, atomicity, repair ----------------------------------------------------


def test_read_only_refuses_writes(path: Path, store: LanceDBStore, corpus) -> None:
    (a, _), _, _ = corpus
    with LanceDBStore.open(path, read_only=True) as reader:
        # The driver can write; this handle may not.
        assert reader.read_only and reader.features.writable
        assert "read-only" in repr(reader)
        assert reader.count_documents() == 3
        assert reader.keyword_search("pears", 5)
        doc, chunks = document("z.md", ["z"])
        with pytest.raises(ReadOnlyError, match="read_only=False"):
            reader.write([doc], chunks, np.stack([unit(1, 0, 0, 0)]))
        with pytest.raises(ReadOnlyError):
            reader.delete_documents([a.id])
        with pytest.raises(ReadOnlyError):
            reader.save_graph({"nodes": []})
        with pytest.raises(ReadOnlyError):
            reader.optimize()
    assert store.count_documents() == 3


def test_the_write_lock_is_reentrant(store: LanceDBStore) -> None:
    """Nested use must not deadlock on a second flock of the same file."""
    with store._write_lock(), store._write_lock():
        _, chunks = write(store, "a.md", ["nested"], [unit(1, 0, 0, 0)])
    assert store.get_chunks([chunks[0].id])


def test_another_handle_sees_new_writes(path: Path, store: LanceDBStore) -> None:
    with LanceDBStore.open(path, read_only=True) as reader:
        assert reader.count_chunks() == 0
        _, chunks = write(store, "a.md", ["late arrival"], [unit(1, 0, 0, 0)])
        assert reader.count_chunks() == 1
        assert reader.keyword_search("arrival", 5)[0][0] == chunks[0].id


def test_failure_between_chunks_and_documents_rolls_back(
    store: LanceDBStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_doc, old_chunks = write(
        store, "a.md", ["old text one", "old text two"], [unit(1, 0, 0, 0)] * 2
    )
    new_doc, new_chunks = document("a.md", ["new text"])
    extra_doc, extra_chunks = document("b.md", ["brand new"])

    def crash(data: pa.Table) -> None:
        raise RuntimeError("killed mid-write")

    with monkeypatch.context() as patch:
        patch.setattr(store, "_merge_documents", crash)
        with pytest.raises(RuntimeError, match="killed"):
            store.write(
                [new_doc, extra_doc],
                new_chunks + extra_chunks,
                np.stack([unit(0, 1, 0, 0), unit(0, 0, 1, 0)]),
            )

    # The previous version is intact: same hash, same chunks, nothing of b.md.
    assert store.document_hashes() == {"a.md": old_doc.content_hash}
    assert store.document_chunks(old_doc.id) == old_chunks
    assert store.count_chunks() == 2
    assert store.keyword_search("new", 5) == []
    assert not (Path(store.path) / ".haiku-rag.pending").exists()

    # A retry repairs.
    store.write([new_doc, extra_doc], new_chunks + extra_chunks, np.stack([unit(0, 1, 0, 0)] * 2))
    assert store.document_hashes() == {
        "a.md": new_doc.content_hash,
        "b.md": extra_doc.content_hash,
    }
    assert store.document_chunks(new_doc.id) == new_chunks
    assert store.count_chunks() == 2


def test_failure_in_delete_rolls_back(store: LanceDBStore, corpus, monkeypatch) -> None:
    (a, a_chunks), _, _ = corpus
    chunks_table = store._table("chunks")

    def crash(where: object) -> None:
        raise RuntimeError("killed")

    monkeypatch.setattr(chunks_table, "delete", crash)
    with pytest.raises(RuntimeError):
        store.delete_documents([a.id])
    assert store.get_document(a.id) is not None
    assert len(store.get_chunks([c.id for c in a_chunks])) == 2


def test_a_killed_write_is_repaired_on_the_next_writable_open(path: Path, store) -> None:
    """Simulate a process dying after the chunks commit: marker left, no document row."""
    kept, kept_chunks = write(store, "a.md", ["kept"], [unit(1, 0, 0, 0)])
    replaced_doc, replaced_chunks = document("a.md", ["replacement"])
    lost_doc, lost_chunks = document("b.md", ["orphaned text"])
    with store._write_lock():
        (path / ".haiku-rag.pending").touch()
        data, _, ids = store._validated(
            [replaced_doc, lost_doc],
            replaced_chunks + lost_chunks,
            np.stack([unit(0, 1, 0, 0), unit(0, 0, 1, 0)]),
        )
        store._merge_chunks(data, ids)
    store.close()

    with LanceDBStore.open(path, read_only=True) as reader:  # readers never repair
        assert reader.count_chunks() == 2
        # The marker is re-checked under the lock (the writer may just have finished).
        (path / ".haiku-rag.pending").rename(path / "moved")
        reader._repair()
        (path / "moved").rename(path / ".haiku-rag.pending")
        assert reader.count_chunks() == 2
    with LanceDBStore.open(path) as reopened:
        assert not (path / ".haiku-rag.pending").exists()
        assert reopened.count_chunks() == 1  # b.md's orphan is gone
        # a.md still records its old hash, so an incremental add sees it as changed.
        assert reopened.document_hashes() == {"a.md": kept.content_hash}
        assert kept.content_hash != replaced_doc.content_hash
        assert reopened.document_chunks(kept.id) == replaced_chunks
    del kept_chunks


# graph and maintenance -----------------------------------------------------------


def test_graph_round_trip(path: Path, store: LanceDBStore) -> None:
    payload = {"nodes": [{"id": "Ünïcode", "kind": "entity"}], "edges": [["a", "b", 1.5]]}
    store.save_graph(payload)
    store.save_graph({**payload, "version": 2})
    assert store.load_graph() == {**payload, "version": 2}
    store.close()
    with LanceDBStore.open(path, read_only=True) as reader:
        assert reader.load_graph()["nodes"][0]["id"] == "Ünïcode"


def test_optimize_builds_an_ann_index_past_the_threshold(store: LanceDBStore) -> None:
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((300, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for start in range(0, 300, 100):
        texts = [f"chunk number {i}" for i in range(start, start + 100)]
        write(store, f"doc{start}.md", texts, list(vectors[start : start + 100]))

    stats = store.optimize(ann_threshold=1_000)
    assert not stats.vector_index and not stats.vector_index_created and stats.chunks == 300

    stats = store.optimize(ann_threshold=200)
    assert stats.vector_index and stats.vector_index_created
    assert store.has_vector_index()
    assert not store.optimize(ann_threshold=200).vector_index_created  # built once

    # Scores stay exact cosine similarities with the index (it is refined).
    query = vectors[0]
    hits = store.vector_search(query, 5)
    exact = np.sort(vectors @ query)[::-1][:5]
    assert [score for _, score in hits] == pytest.approx(list(exact), abs=1e-4)
    assert store.keyword_search("chunk", 3)


def test_optimize_removes_orphans(store: LanceDBStore) -> None:
    doc, chunks = document("a.md", ["orphan"])
    data, _, ids = store._validated([doc], chunks, np.stack([unit(1, 0, 0, 0)]))
    store._merge_chunks(data, ids)
    assert store.optimize().orphans_removed == 1
    assert store.count_chunks() == 0


def test_metadata_stays_json(store: LanceDBStore) -> None:
    doc, chunks = document("a.md", ["x"], metadata={"path": Path("/tmp/x"), "nested": {"k": [1]}})
    store.write([doc], chunks, np.stack([unit(1, 0, 0, 0)]))
    row = store._table("documents").search().limit(None).to_list()[0]
    assert json.loads(row["metadata_json"]) == {"path": "/tmp/x", "nested": {"k": [1]}}
