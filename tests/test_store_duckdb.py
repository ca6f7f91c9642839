"""The DuckDB driver against real DuckDB files in tmp_path (extensions loaded offline)."""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from pathlib import Path

import duckdb
import numpy as np
import pytest
import yaml

from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig
from haiku.rag.documents import Chunk, Document, chunk_id_for
from haiku.rag.errors import ReadOnlyError, StoreError, StoreNotFoundError
from haiku.rag.store import _duckdb_ext, driver_class, infer_driver
from haiku.rag.store import duckdb as driver
from haiku.rag.store.base import Store, StoreSettings
from haiku.rag.store.duckdb import (
    DuckDBStore,
    DuckDBStoreWarning,
    StoreBusyError,
    delete_store,
    store_paths,
)

DIM = 4


def settings(dim: int = DIM, model: str = "test:fake", name: str = "duckdb") -> StoreSettings:
    return StoreSettings(
        driver=name, embedding_model=model, embedding_dim=dim, chunk_size=200, chunk_overlap=10
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


def write(store: DuckDBStore, uri: str, texts: list[str], vectors: list[np.ndarray], **extra):
    doc, chunks = document(uri, texts, **extra)
    store.write([doc], chunks, np.stack(vectors) if vectors else np.zeros((0, DIM)))
    return doc, chunks


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "kb.duckdb"


@pytest.fixture
def store(path: Path):
    store = DuckDBStore.create(path, settings())
    store.idle_release = None
    yield store
    store.close()


@pytest.fixture
def filled(store: DuckDBStore):
    """Three documents whose vectors point along different axes."""
    a = write(
        store,
        "a.md",
        ["apples and pears grow in orchards", "the zygomorphic flower of the orchid"],
        [unit(1, 0, 0, 0), unit(1, 1, 0, 0)],
        title="Fruit",
        metadata={"lang": "en", "tags": ["x"]},
    )
    b = write(
        store,
        "b.md",
        ["bake bread at 250 degrees", "pasta needs salted water"],
        [unit(0, 1, 0, 0), unit(0, 1, 1, 0)],
    )
    c = write(store, "c.md", ["café 日本語 quarks and leptons"], [unit(0, 0, 0, 1)])
    return a, b, c


# -- registry, paths, lifecycle ---------------------------------------------------------


def test_registry_picks_duckdb_by_suffix_and_name():
    assert infer_driver("kb.duckdb") == "duckdb"
    assert infer_driver("kb.yaml", "duckdb") == "duckdb"
    assert driver_class("duckdb") is DuckDBStore


def test_store_paths_name_one_store_by_either_file(tmp_path: Path):
    db, file = tmp_path / "kb.duckdb", tmp_path / "kb.yaml"
    assert store_paths(db) == (db, file)
    assert store_paths(file) == (db, file)
    assert store_paths(tmp_path / "kb.yml") == (db, tmp_path / "kb.yml")
    assert store_paths(tmp_path / "kb") == (tmp_path / "kb", file)


def test_create_writes_both_files_and_open_checks_them(path: Path, store: DuckDBStore):
    assert isinstance(store, Store)
    assert path.is_file() and path.with_suffix(".yaml").is_file()
    assert store.features.writable and store.features.keyword_search and store.features.graph
    assert store.settings == settings()
    assert store.count_documents() == 0 and store.count_chunks() == 0
    reopened = DuckDBStore.open(path.with_suffix(".yaml"), read_only=True)
    assert reopened.path == str(path)
    assert reopened.settings == settings()
    assert reopened.read_only and reopened.features.writable  # what the driver can do
    reopened.close()


def test_sidecar_is_plain_yaml_without_vectors_or_text(path: Path, store, filled):
    data = yaml.safe_load(path.with_suffix(".yaml").read_text(encoding="utf-8"))
    assert data["haiku_rag"] == {"format": 1, "driver": "duckdb", "database": "kb.duckdb"}
    assert data["settings"]["driver"] == "duckdb"
    assert [doc["uri"] for doc in data["documents"]] == ["a.md", "b.md", "c.md"]
    assert set(data["documents"][0]) == {
        "id",
        "uri",
        "title",
        "content_hash",
        "metadata",
        "created_at",
        "updated_at",
    }
    assert "orchards" not in path.with_suffix(".yaml").read_text(encoding="utf-8")


def test_create_refuses_an_existing_store_and_wrong_settings(path: Path, store):
    with pytest.raises(StoreError, match="already exists"):
        DuckDBStore.create(path, settings())
    with pytest.raises(StoreError, match="driver='duckdb'"):
        DuckDBStore.create(path.with_name("other.duckdb"), settings(name="yaml"))


def test_create_refuses_a_database_with_data_but_reuses_an_interrupted_create(tmp_path: Path):
    foreign = tmp_path / "foreign.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    with pytest.raises(StoreError, match="holds data"):
        DuckDBStore.create(foreign, settings())
    garbage = tmp_path / "garbage.duckdb"
    garbage.write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError, match="holds data"):
        DuckDBStore.create(garbage, settings())
    interrupted = tmp_path / "half.duckdb"
    DuckDBStore.create(interrupted, settings()).close()
    interrupted.with_suffix(".yaml").unlink()  # the sidecar is written last
    store = DuckDBStore.create(interrupted, settings(dim=8))
    assert store.settings.embedding_dim == 8
    store.close()


def test_open_missing_store_and_missing_sidecar(path: Path, store, filled):
    with pytest.raises(StoreNotFoundError, match="create=True"):
        DuckDBStore.open(path.with_name("nope.duckdb"))
    store.close()
    path.with_suffix(".yaml").unlink()
    with pytest.raises(StoreError, match=r"kb\.yaml is missing.*Restore it") as error:
        DuckDBStore.open(path)
    assert not isinstance(error.value, StoreNotFoundError)


def test_reopening_with_another_driver_says_how_to_switch(tmp_path: Path):
    yaml_store = tmp_path / "kb.yaml"
    yaml_store.write_text(
        'haiku_rag: {"format": 1, "driver": "yaml"}\nsettings: {"driver": "yaml"}\n'
    )
    with pytest.raises(StoreError, match=r"driver='yaml'.*add your documents to it again"):
        DuckDBStore.open(yaml_store)
    lance = tmp_path / "kb.lancedb"
    (lance / "settings.lance").mkdir(parents=True)
    with pytest.raises(StoreError, match="driver='lancedb'"):
        DuckDBStore.open(lance)
    plain = tmp_path / "dir.duckdb"
    plain.mkdir()
    with pytest.raises(StoreError, match="is a directory"):
        DuckDBStore.open(plain)
    (tmp_path / "x.yaml").mkdir()
    with pytest.raises(StoreError, match="is a directory"):
        DuckDBStore.open(tmp_path / "x.duckdb")


def test_sidecar_problems_are_clear_errors(path: Path, store):
    store.close()
    file = path.with_suffix(".yaml")
    good = file.read_text(encoding="utf-8")
    cases = {
        "just text\n": "no `haiku_rag` header",
        "haiku_rag: [1\n": "not valid YAML",
        good.replace('"embedding_dim": 4', '"embedding_dim": "four"'): "damaged",
        good.replace('"format": 1', '"format": 99'): "upgrade haiku.rag",
    }
    for text, message in cases.items():
        file.write_text(text, encoding="utf-8")
        with pytest.raises(StoreError, match=message):
            DuckDBStore.open(path)
    file.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(StoreError, match="Cannot read"):
        DuckDBStore.open(path)


def test_sidecar_written_by_another_yaml_tool_still_opens(path: Path, store, filled):
    store.close()
    file = path.with_suffix(".yaml")
    data = yaml.safe_load(file.read_text(encoding="utf-8"))
    file.write_text(yaml.safe_dump(data, default_flow_style=False), encoding="utf-8")
    reopened = DuckDBStore.open(path, read_only=True)
    assert [doc.uri for doc in reopened.list_documents()] == ["a.md", "b.md", "c.md"]
    assert reopened.get_document(filled[0][0].id).metadata == {"lang": "en", "tags": ["x"]}
    reopened.close()


def test_awkward_strings_survive_the_sidecar_for_any_yaml_reader(path: Path, store):
    title = 'quote " back\\slash \u2028 line \x85 nel \ufeff bom \U0001f600 emoji: # not-a-comment'
    doc, _ = write(
        store, "odd.md", ["text"], [unit(1, 0, 0, 0)], title=title, metadata={"k": title}
    )
    data = yaml.safe_load(path.with_suffix(".yaml").read_text(encoding="utf-8"))
    assert data["documents"][0]["title"] == title
    store.close()
    reopened = DuckDBStore.open(path, read_only=True)
    got = reopened.get_document(doc.id)
    assert got is not None and got.title == title and got.metadata == {"k": title}
    reopened.close()


def test_closed_store_refuses_use_and_close_is_idempotent(store):
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.count_chunks()
    with pytest.raises(StoreError, match="closed"):
        store.write([], [], np.zeros((0, DIM)))


# -- documents and chunks ------------------------------------------------------------------


def test_round_trip(store, filled):
    (a, a_chunks), (b, _), (c, _) = filled
    got = store.get_document(a.id)
    assert got is not None
    assert got.content == a.content and got.title == "Fruit"
    assert got.metadata == {"lang": "en", "tags": ["x"]}
    assert got.created_at == a.created_at and got.content_hash == a.content_hash
    assert store.get_document("missing") is None
    assert store.count_documents() == 3 and store.count_chunks() == 5
    assert store.document_hashes() == {d.uri: d.content_hash for d in (a, b, c)}
    assert [x.uri for x in store.list_documents()] == ["a.md", "b.md", "c.md"]
    assert [x.uri for x in store.list_documents(limit=1, offset=1)] == ["b.md"]
    assert store.list_documents(limit=0) == []
    with pytest.raises(ValueError):
        store.list_documents(offset=-1)
    assert store.document_chunks(a.id) == a_chunks
    assert store.document_chunks("missing") == []
    asked = [a_chunks[1].id, "missing", a_chunks[0].id, a_chunks[1].id]
    assert [ch.id for ch in store.get_chunks(asked)] == [
        a_chunks[1].id,
        a_chunks[0].id,
        a_chunks[1].id,
    ]
    assert store.get_chunks([]) == []


def test_replace_is_incremental(store, filled, caplog):
    """Re-adding one document deletes and inserts only its own rows."""
    (a, _), (b, b_chunks), _ = filled
    with caplog.at_level(logging.DEBUG, logger=driver.__name__):
        _doc, chunks = write(store, "a.md", ["only one chunk now"], [unit(0, 0, 1, 0)])
    assert "2 chunk rows deleted, 1 inserted" in caplog.text
    assert store.document_chunks(a.id) == chunks
    assert store.get_document(a.id).content == "only one chunk now"
    assert store.document_chunks(b.id) == b_chunks
    assert store.count_chunks() == 4


def test_empty_and_chunkless_writes(store):
    store.write([], [], np.zeros((0, DIM)))
    doc, _ = write(store, "empty.md", [], [])
    assert store.count_documents() == 1 and store.document_chunks(doc.id) == []


def test_bad_writes_change_nothing(store, filled):
    (_a, _a_chunks), _, _ = filled
    hashes = store.document_hashes()
    new, chunks = document("n.md", ["x", "y"])
    vectors = np.stack([unit(1, 0, 0, 0), unit(0, 1, 0, 0)])
    _other, other_chunks = document("o.md", ["z"])
    cases = [
        (([new, new], chunks, vectors), "same document twice"),
        (([new], [chunks[0], chunks[0]], vectors), "same chunk id"),
        (([new], chunks + other_chunks, np.vstack([vectors, vectors[:1]])), "not in this write"),
        (([new], chunks, vectors[:1]), "one vector per chunk"),
        (([new], chunks, np.ones((2, 3), dtype=np.float32)), "dimensions"),
        (([new], chunks, np.full((2, DIM), np.nan, dtype=np.float32)), "NaN"),
    ]
    for args, message in cases:
        with pytest.raises(StoreError, match=message):
            store.write(*args)
    assert store.document_hashes() == hashes and store.count_chunks() == 5


def test_delete(path: Path, store, filled):
    (a, _), (_b, _), _ = filled
    assert store.delete_documents([a.id, a.id, "missing"]) == 1
    assert store.delete_documents(["missing"]) == 0
    assert store.delete_documents([]) == 0
    assert store.get_document(a.id) is None and store.document_chunks(a.id) == []
    assert store.count_documents() == 2 and store.count_chunks() == 3
    assert "a.md" not in path.with_suffix(".yaml").read_text(encoding="utf-8")
    assert [x for x, _ in store.vector_search(unit(1, 0, 0, 0), 10)] != []
    assert all(
        store.get_chunks([cid])[0].document_id != a.id
        for cid, _ in store.vector_search(unit(1, 0, 0, 0), 10)
    )


def test_graph_round_trip(path: Path, store):
    assert store.load_graph() is None
    store.save_graph({"nodes": ["ü"], "edges": []})
    store.save_graph({"nodes": ["a", "b"], "edges": [["a", "b"]]})
    store.close()
    reopened = DuckDBStore.open(path, read_only=True)
    assert reopened.load_graph() == {"nodes": ["a", "b"], "edges": [["a", "b"]]}
    reopened.close()


def test_read_only_refuses_writes(path: Path, store, filled):
    store.close()
    reader = DuckDBStore.open(path, read_only=True)
    doc, chunks = document("n.md", ["x"])
    for call in (
        lambda: reader.write([doc], chunks, np.stack([unit(1, 0, 0, 0)])),
        lambda: reader.delete_documents([filled[0][0].id]),
        lambda: reader.save_graph({}),
        lambda: reader.optimize(),
    ):
        with pytest.raises(ReadOnlyError, match="read-only"):
            call()
    assert reader.count_documents() == 3
    reader.close()


# -- search --------------------------------------------------------------------------------


def test_vector_search_is_cosine_best_first_with_exact_filters(store, filled):
    (_a, a_chunks), (_b, b_chunks), (c, c_chunks) = filled
    results = store.vector_search(unit(1, 0.1, 0, 0), 3)
    assert [cid for cid, _ in results] == [a_chunks[0].id, a_chunks[1].id, b_chunks[0].id]
    expected = float(unit(1, 0.1, 0, 0) @ unit(1, 0, 0, 0))
    assert results[0][1] == pytest.approx(expected, abs=1e-6)
    filtered = store.vector_search(unit(1, 0, 0, 0), 10, document_ids={c.id})
    assert [cid for cid, _ in filtered] == [c_chunks[0].id]
    assert store.vector_search(unit(1, 0, 0, 0), 3, document_ids=set()) == []
    assert store.vector_search(unit(1, 0, 0, 0), 0) == []
    with pytest.raises(StoreError, match="embed queries with that model"):
        store.vector_search(np.ones(3, dtype=np.float32), 3)


def test_vector_ties_are_broken_by_id(store):
    vector = unit(1, 0, 0, 0)
    doc, chunks = document("t.md", ["one", "two", "three"])
    store.write([doc], chunks, np.stack([vector] * 3))
    ids = [cid for cid, _ in store.vector_search(vector, 3)]
    assert ids == sorted(ch.id for ch in chunks)


def test_hnsw_index_is_used_for_unfiltered_queries_only(path: Path):
    """A store over `hnsw_min_chunks` gets the index when its writing session ends;
    unfiltered kNN then runs on it, filtered kNN stays an exact scan."""
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((300, DIM)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    store = DuckDBStore.create(path, settings())
    store.hnsw_min_chunks = 100
    docs, chunks = [], []
    for i in range(30):
        doc, doc_chunks = document(f"d{i:02}.md", [f"chunk {i} {j}" for j in range(10)])
        docs.append(doc)
        chunks.extend(doc_chunks)
    store.write(docs, chunks, matrix)
    assert store.status().vector_index is False
    store.close()  # the session ends: index built, WAL checkpointed
    store = DuckDBStore.open(path, read_only=True)
    status = store.status()
    assert status.vector_index and status.wal_bytes == 0 and not status.keyword_index_stale
    ids = np.array([ch.id for ch in chunks])
    query = matrix[5]
    with store._reading() as reader:
        assert reader is not None
        sql, params = store._vector_query(reader, query, 10, None)
        plan = reader.con.execute("EXPLAIN " + sql, params).fetchall()[0][1]
        assert "HNSW_INDEX_SCAN" in plan
        sql, params = store._vector_query(reader, query, 10, {docs[3].id})
        plan = reader.con.execute("EXPLAIN " + sql, params).fetchall()[0][1]
        assert "HNSW_INDEX_SCAN" not in plan and "SEQ_SCAN" in plan
    exact = [str(x) for x in ids[np.argsort(-(matrix @ query), kind="stable")[:10]]]
    assert [cid for cid, _ in store.vector_search(query, 10)] == exact
    allowed = {docs[3].id, docs[17].id}
    rows = [i for i, ch in enumerate(chunks) if ch.document_id in allowed]
    best = sorted(rows, key=lambda i: -float(matrix[i] @ query))[:5]
    got = store.vector_search(query, 5, document_ids=allowed)
    assert [cid for cid, _ in got] == [chunks[i].id for i in best]
    assert got[0][1] == pytest.approx(float(matrix[best[0]] @ query), abs=1e-6)
    store.close()


def test_with_an_index_writes_stay_in_the_wal_until_the_session_ends(path: Path):
    store = DuckDBStore.create(path, settings())
    store.hnsw_min_chunks = 1
    write(store, "a.md", ["first"], [unit(1, 0, 0, 0)])
    store.close()
    store = DuckDBStore.open(path)
    store.idle_release = None
    assert store.status().vector_index
    write(store, "b.md", ["second"], [unit(0, 1, 0, 0)])
    wal = path.with_name(path.name + ".wal")
    assert wal.exists() and wal.stat().st_size > 0
    reader_view = [cid for cid, _ in store.vector_search(unit(0, 1, 0, 0), 1)]
    assert store.get_chunks(reader_view)[0].content == "second"
    store.close()
    assert not wal.exists()


def test_optimize_reclaims_index_space_and_warns_about_stale_copies(
    path: Path, monkeypatch, caplog
):
    monkeypatch.setattr(driver, "RECLAIM_WARN_AFTER", 2)
    store = DuckDBStore.create(path, settings())
    store.hnsw_min_chunks = 1
    write(store, "a.md", ["first"], [unit(1, 0, 0, 0)])
    assert store.optimize().vector_index
    for i in range(2):
        store = DuckDBStore.open(path)
        write(store, f"n{i}.md", [f"text {i}"], [unit(0, 1, 0, i)])
        with caplog.at_level(logging.WARNING, logger=driver.__name__):
            store.close()
    assert "optimize(reclaim=True)" in caplog.text
    store = DuckDBStore.open(path)
    status = store.optimize(reclaim=True)
    assert status.vector_index and status.chunks == 3
    assert [cid for cid, _ in store.vector_search(unit(1, 0, 0, 0), 1)] != []
    store.close()


def test_keyword_search_ranks_filters_and_rebuilds_after_writes(store, filled):
    (_a, a_chunks), (b, b_chunks), (_c, c_chunks) = filled
    assert next(cid for cid, _ in store.keyword_search("orchid flower", 5)) == a_chunks[1].id
    assert [cid for cid, _ in store.keyword_search("250 degrees", 5)] == [b_chunks[0].id]
    assert [cid for cid, _ in store.keyword_search("日本語", 5)] == [c_chunks[0].id]
    assert [cid for cid, _ in store.keyword_search("cafe", 5)] == [c_chunks[0].id]
    assert [cid for cid, _ in store.keyword_search("baking", 5)] == [b_chunks[0].id]
    assert store.keyword_search("orchards pasta", 5, document_ids={b.id}) == [
        (b_chunks[1].id, pytest.approx(store.keyword_search("pasta", 1)[0][1]))
    ]
    assert store.keyword_search("pasta", 5, document_ids=set()) == []
    assert store.keyword_search("   ", 5) == [] and store.keyword_search("pasta", 0) == []
    new, _ = write(store, "d.md", ["neutrinos oscillate"], [unit(0, 0, 1, 1)])
    assert store.status().keyword_index_stale
    hits = store.keyword_search("neutrinos", 5)
    assert [store.get_chunks([cid])[0].document_id for cid, _ in hits] == [new.id]
    assert not store.status().keyword_index_stale


@pytest.mark.parametrize(
    "query",
    [
        '"unbalanced',
        "a AND (b OR",
        "c++ -x *y* ~z^2 'q'",
        "content:pasta",
        "'; DROP TABLE chunks; --",
        "\\ \x00x",
        "NOT",
        "pasta)",
    ],
)
def test_keyword_search_tolerates_query_syntax(store, filled, query):
    assert isinstance(store.keyword_search(query, 5), list)
    assert store.count_chunks() == 5


def test_read_only_store_warns_about_a_stale_keyword_index(path: Path, store, filled):
    (_a, a_chunks), _, _ = filled
    store._wrote = False  # a writer that stopped before finishing its session
    store.close()
    with pytest.warns(DuckDBStoreWarning, match="keyword index"):
        reader = DuckDBStore.open(path, read_only=True)
        assert reader.status().keyword_index_stale
        reader.keyword_search("orchid", 5)
    reader.close()
    writer = DuckDBStore.open(path)
    assert writer.keyword_search("orchid", 5)[0][0] == a_chunks[1].id
    writer.close()


def test_keyword_rebuild_that_cannot_get_the_lock_falls_back(path: Path, store, caplog):
    write(store, "a.md", ["orchid"], [unit(1, 0, 0, 0)])
    store.lock_timeout = 0
    other = DuckDBStore.open(path, read_only=True, lock_timeout=0)
    other.idle_release = None
    with (
        caplog.at_level(logging.WARNING, logger=driver.__name__),
        pytest.warns(DuckDBStoreWarning),
    ):
        assert store.keyword_search("orchid", 5) == []  # the index predates the write
    assert "not rebuilt" in caplog.text and "open in this process" in caplog.text
    other.close()


def test_missing_keyword_index_returns_nothing(path: Path, store, filled):
    store._wrote = False
    store.close()
    con = _duckdb_ext.connect(path, read_only=False)
    con.execute("PRAGMA drop_fts_index('chunks')")
    con.close()
    reader = DuckDBStore.open(path, read_only=True)
    with pytest.warns(DuckDBStoreWarning):
        assert reader.keyword_search("orchid", 5) == []
    reader.close()
    writer = DuckDBStore.open(path)
    assert writer.keyword_search("orchid", 5) != []
    writer.close()


# -- crashes, drift and a missing database ---------------------------------------------------


def test_exception_mid_transaction_leaves_the_previous_state(
    path: Path, store, filled, monkeypatch
):
    (a, a_chunks), _, _ = filled
    hashes, sidecar = store.document_hashes(), path.with_suffix(".yaml").read_bytes()
    real = driver._set_meta

    def boom(con, key, value):
        if key == "fts_dirty":
            raise RuntimeError("simulated crash")
        real(con, key, value)

    monkeypatch.setattr(driver, "_set_meta", boom)
    with pytest.raises(RuntimeError):
        write(store, "a.md", ["replacement"], [unit(0, 0, 1, 0)])
    with pytest.raises(RuntimeError):
        store.delete_documents([a.id])
    monkeypatch.undo()
    assert store.document_hashes() == hashes
    assert store.document_chunks(a.id) == a_chunks
    assert path.with_suffix(".yaml").read_bytes() == sidecar
    assert not list(path.parent.glob(".kb.yaml.*.tmp"))


def test_crash_between_commit_and_sidecar_is_repaired_by_re_adding(
    path: Path, store, filled, monkeypatch
):
    (a, _), _, _ = filled

    def fail(temp, file):
        raise OSError("disk full")

    monkeypatch.setattr(driver, "_publish", fail)
    with pytest.raises(StoreError, match="run the same add again"):
        write(store, "a.md", ["changed text"], [unit(0, 0, 1, 0)])
    with pytest.raises(StoreError, match="could not be"):
        write(store, "new.md", ["orphan text"], [unit(0, 0, 1, 0)])
    monkeypatch.undo()
    assert not list(path.parent.glob(".kb.yaml.*.tmp"))
    # The database is ahead of the sidecar: the changed document reads as changed...
    hashes = store.document_hashes()
    assert hashes["a.md"] == "" and "new.md" not in hashes
    current = store.get_document(a.id)  # the content there is, with its own hash
    assert current.content == "changed text"
    assert current.content_hash == document("a.md", ["changed text"])[0].content_hash
    assert store.count_chunks() == 5  # a.md now has 1 chunk, plus the orphan
    # ...and the next write prunes the orphan; re-adding repairs the changed one.
    write(store, "a.md", ["changed text"], [unit(0, 0, 1, 0)])
    hashes = store.document_hashes()
    assert hashes["a.md"] == document("a.md", ["changed text"])[0].content_hash
    assert store.count_chunks() == 4
    assert all(h for h in hashes.values())


def test_missing_database_warns_and_queries_return_nothing(path: Path, store, filled):
    (a, _), _, _ = filled
    store.close()
    path.unlink()
    with pytest.warns(DuckDBStoreWarning, match=r"kb\.duckdb is missing.*haiku-rag add"):
        reader = DuckDBStore.open(path, read_only=True)
    assert reader.vector_search(unit(1, 0, 0, 0), 3) == []
    assert reader.keyword_search("orchid", 3) == []
    assert reader.get_chunks(["x"]) == [] and reader.document_chunks(a.id) == []
    assert reader.count_chunks() == 0 and reader.count_documents() == 3
    assert reader.load_graph() is None
    missing = reader.get_document(a.id)
    assert missing.content == "" and missing.content_hash == ""  # a rebuild stays "changed"
    assert [d.content_hash for d in reader.list_documents()] == ["", "", ""]
    assert set(reader.document_hashes().values()) == {""}
    status = reader.status()
    assert status.chunks == 0 and status.database_bytes == 0
    reader.close()


def test_empty_database_file_warns_and_a_write_rebuilds_it(path: Path, store, filled):
    store.close()
    path.write_bytes(b"")
    with pytest.warns(DuckDBStoreWarning, match="missing or empty"):
        writer = DuckDBStore.open(path)
    assert writer.count_chunks() == 0
    doc, _chunks = write(writer, "a.md", ["apples again"], [unit(1, 0, 0, 0)])
    assert writer.count_chunks() == 1 and writer.document_hashes()["a.md"] == doc.content_hash
    assert writer.document_hashes()["b.md"] == ""  # not in the new database: add re-embeds it
    writer.close()


def test_database_without_our_rows_warns(path: Path, store, filled):
    store.close()
    path.unlink()
    DuckDBStore.create(path.with_name("fresh.duckdb"), settings()).close()
    os.replace(path.with_name("fresh.duckdb"), path)
    with pytest.warns(DuckDBStoreWarning, match="missing or empty"):
        DuckDBStore.open(path, read_only=True).close()


def test_database_of_another_store_is_refused(path: Path, store, filled, tmp_path: Path):
    store.close()
    other = tmp_path / "other.duckdb"
    DuckDBStore.create(other, settings(dim=8, model="other:model")).close()
    os.replace(other, path)
    with pytest.raises(StoreError, match="belong to different stores"):
        DuckDBStore.open(path)


def test_foreign_or_uninitialised_databases(path: Path, store, filled):
    store.close()
    path.unlink()
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    with pytest.raises(StoreError, match=r"not a haiku\.rag store"):
        DuckDBStore.open(path)
    path.unlink()
    duckdb.connect(str(path)).close()  # a valid database with no tables
    with pytest.warns(DuckDBStoreWarning):
        writer = DuckDBStore.open(path)
    write(writer, "z.md", ["zebra"], [unit(1, 0, 0, 0)])  # initialises the schema
    assert writer.count_chunks() == 1
    writer.close()
    path.write_bytes(b"garbage" * 1000)
    with pytest.raises(StoreError, match="Cannot open"):
        DuckDBStore.open(path)


def test_bad_settings_row_is_a_clear_error(path: Path, store):
    store._wrote = False
    store.close()
    con = _duckdb_ext.connect(path, read_only=False)
    con.execute("UPDATE meta SET value = '{}' WHERE key = 'settings'")
    con.close()
    with pytest.raises(StoreError, match="no valid settings"):
        DuckDBStore.open(path)


def test_sidecar_replaced_or_removed_while_open(path: Path, store, filled):
    store.close()
    first = DuckDBStore.open(path)
    first.idle_release = 0.05
    assert first.count_documents() == 3
    first._release_reader()
    second = DuckDBStore.open(path)
    write(second, "d.md", ["delta"], [unit(0, 0, 1, 0)])
    second.close()
    assert first.count_documents() == 4  # reconnected and reloaded the new sidecar
    first._release_reader()
    path.with_suffix(".yaml").unlink()
    with pytest.raises(StoreError, match="disappeared"):
        first.count_documents()
    first.close()


# -- locking ----------------------------------------------------------------------------------


def test_a_reader_in_this_process_blocks_a_writer_with_a_clear_error(path: Path, store, filled):
    store.close()
    reader = DuckDBStore.open(path, read_only=True)
    reader.idle_release = None
    writer = DuckDBStore.open(path, lock_timeout=0.1)
    with pytest.raises(StoreBusyError, match="open in this process"):
        write(writer, "x.md", ["x"], [unit(1, 0, 0, 0)])
    with pytest.raises(StoreBusyError):
        delete_store(path)
    reader.close()
    write(writer, "x.md", ["x"], [unit(1, 0, 0, 0)])
    writer.close()


def test_idle_read_connections_are_released(path: Path, store, filled):
    store.idle_release = 0.05
    assert store.count_chunks() == 5
    assert store._reader is not None
    store._on_idle()  # too early: reschedules
    assert store._reader is not None
    deadline = time.monotonic() + 5
    while store._reader is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store._reader is None
    store.idle_release = None
    store._on_idle()
    assert store.count_chunks() == 5


def test_busy_messages_name_the_holder(tmp_path: Path):
    db = tmp_path / "kb.duckdb"
    lock = duckdb.IOException(
        'IO Error: Could not set lock on file "x": Conflicting lock is held in python (PID 42).'
    )
    assert "being written by another process (PID 42)" in driver._busy_message(
        db, lock, writing=False
    )
    readers = duckdb.IOException(
        "Could not set lock on file: Conflicting lock is held in p (PID 7). However, you "
        "would be able to open this database in read-only mode"
    )
    assert "being read by another process (PID 7)" in driver._busy_message(
        db, readers, writing=True
    )
    anonymous = duckdb.IOException("Could not set lock on file")
    assert "another process;" in driver._busy_message(db, anonymous, writing=True)
    assert driver._busy_message(db, duckdb.IOException("disk on fire"), writing=True) is None


# -- extensions ---------------------------------------------------------------------------------


def test_extensions_load_from_their_packages_and_nothing_is_installed(
    path: Path, store, filled, isolated_env: Path
):
    store.keyword_search("orchid", 1)
    with store._reading() as reader:
        assert reader is not None
        settings_rows = reader.con.execute(
            "SELECT current_setting('autoinstall_known_extensions'), "
            "current_setting('autoload_known_extensions')"
        ).fetchone()
        assert settings_rows == (False, False)
        rows = reader.con.execute(
            "SELECT extension_name, loaded, installed FROM duckdb_extensions() "
            "WHERE extension_name IN ('vss', 'fts') ORDER BY 1"
        ).fetchall()
    assert rows == [("fts", True, False), ("vss", True, False)]
    assert not (isolated_env / ".duckdb").exists()
    for name in ("vss", "fts"):
        found = _duckdb_ext.extension_path(name)
        assert found.is_file() and f"v{duckdb.__version__}" in str(found)


def test_extension_problems_say_what_to_install(monkeypatch):
    _duckdb_ext.extension_path.cache_clear()
    try:
        monkeypatch.setattr(duckdb, "__version__", "0.0.1")
        with pytest.raises(StoreError, match=r"no vss extension for duckdb 0\.0\.1.*v1"):
            _duckdb_ext.extension_path("vss")
        monkeypatch.setattr(_duckdb_ext.importlib.util, "find_spec", lambda name: None)
        with pytest.raises(StoreError, match=r"pip install duckdb-extension-fts==0\.0\.1"):
            _duckdb_ext.extension_path("fts")
    finally:
        monkeypatch.undo()
        _duckdb_ext.extension_path.cache_clear()


def test_a_failed_load_closes_the_connection(tmp_path: Path, monkeypatch):
    def broken(con):
        raise StoreError("no extension")

    monkeypatch.setattr(_duckdb_ext, "load_extensions", broken)
    with pytest.raises(StoreError):
        _duckdb_ext.connect(tmp_path / "x.duckdb", read_only=False)
    monkeypatch.undo()
    con = duckdb.connect(str(tmp_path / "x.duckdb"))  # not left locked
    con.close()


# -- deleting -----------------------------------------------------------------------------------


def test_delete_store_removes_sidecar_database_and_wal(path: Path):
    store = DuckDBStore.create(path, settings())
    store.hnsw_min_chunks = 1
    write(store, "a.md", ["a"], [unit(1, 0, 0, 0)])
    store.close()
    store = DuckDBStore.open(path)
    write(store, "b.md", ["b"], [unit(0, 1, 0, 0)])
    wal = path.with_name(path.name + ".wal")
    assert wal.exists()
    store._wrote = False
    store.close()
    (path.parent / ".kb.yaml.123.tmp").write_text("stray")
    delete_store(path)
    assert sorted(p.name for p in path.parent.iterdir()) == []
    with pytest.raises(StoreNotFoundError):
        delete_store(path)


def test_delete_store_refuses_what_is_not_a_duckdb_store(tmp_path: Path):
    yaml_store = tmp_path / "kb.yaml"
    yaml_store.write_text('haiku_rag: {"driver": "yaml"}\nsettings: {}\n')
    with pytest.raises(StoreError, match="driver='yaml'"):
        delete_store(yaml_store)
    foreign = tmp_path / "f.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    with pytest.raises(StoreError, match="refusing"):
        delete_store(foreign)
    assert foreign.exists()
    garbage = tmp_path / "g.duckdb"
    garbage.write_bytes(b"garbage" * 1000)
    with pytest.raises(StoreError, match="Cannot open"):
        delete_store(garbage)


def test_delete_store_by_sidecar_when_the_database_is_gone(path: Path, store):
    store.close()
    path.unlink()
    delete_store(path.with_suffix(".yaml"))
    assert not path.with_suffix(".yaml").exists()


# -- through the client ---------------------------------------------------------------------------


async def test_client_round_trip_on_a_duckdb_store(tmp_path: Path, config: AppConfig, corpus):
    db = tmp_path / "kb.duckdb"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DuckDBStoreWarning)
        async with HaikuRAG(db, config, create=True) as kb:
            report = await kb.add(str(corpus))
            assert len(report.added) == 5
            hits = await kb.search("sourdough starter", top_k=2)
            assert hits and "Sourdough" in hits[0].content
            info = await kb.info()
            assert info.driver == "duckdb" and info.signals == ["vector", "bm25"]
        async with HaikuRAG(db, config) as kb:
            again = await kb.add(str(corpus))
            assert again.chunks_embedded == 0 and len(again.unchanged) == 5
        async with HaikuRAG(db, config, read_only=True) as kb:
            assert (await kb.search("spaghetti", top_k=1))[0].document_uri.endswith("pasta.md")
    assert json.loads(json.dumps(yaml.safe_load(db.with_suffix(".yaml").read_text())))


# -- rarely taken paths -----------------------------------------------------------------------


def test_close_that_cannot_finish_the_session_logs_and_still_closes(
    path: Path, store, filled, caplog
):
    other = DuckDBStore.open(path, read_only=True)
    other.idle_release = None
    store.lock_timeout = 0
    with caplog.at_level(logging.WARNING, logger=driver.__name__):
        store.close()
    assert "Could not finish writing" in caplog.text
    with pytest.raises(StoreError, match="closed"):
        store.count_chunks()
    other.close()


def test_failed_keyword_rebuild_keeps_the_index_marked_stale(
    path: Path, store, filled, monkeypatch
):
    real = driver._set_meta

    def boom(con, key, value):
        if (key, value) == ("fts_dirty", "0"):
            raise RuntimeError("simulated crash")
        real(con, key, value)

    monkeypatch.setattr(driver, "_set_meta", boom)
    with pytest.raises(RuntimeError):
        store.keyword_search("orchid", 5)
    monkeypatch.undo()
    assert store.status().keyword_index_stale
    assert store.keyword_search("orchid", 5)


def test_failed_sidecar_write_leaves_no_temp_file(path: Path, store, filled, monkeypatch):
    hashes = store.document_hashes()

    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(driver.os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        write(store, "n.md", ["new"], [unit(1, 0, 0, 0)])
    monkeypatch.undo()
    assert not list(path.parent.glob(".kb.yaml.*.tmp"))
    assert store.document_hashes() == hashes


def test_stale_keyword_warning_is_given_once(path: Path, store, filled):
    store._wrote = False
    store.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader = DuckDBStore.open(path, read_only=True)
        reader.keyword_search("orchid", 5)
        reader.keyword_search("pasta", 5)
    assert len([w for w in caught if issubclass(w.category, DuckDBStoreWarning)]) == 1
    reader.close()
