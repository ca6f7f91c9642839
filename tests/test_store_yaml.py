"""The yaml driver's own contract (file layout, both readers, errors, atomic writes) and the
in-memory helpers it is built on (`_vectors`, `_tantivy`). The behaviour every driver
shares is in test_store_conformance.py."""

from __future__ import annotations

import binascii
import os
import stat
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from haiku.rag.documents import Chunk, Document, chunk_id_for
from haiku.rag.errors import ReadOnlyError, StoreError, StoreNotFoundError
from haiku.rag.store import driver_class, infer_driver
from haiku.rag.store import yaml as yaml_store
from haiku.rag.store._tantivy import STOP_WORDS, KeywordIndex, analyzer
from haiku.rag.store._vectors import VectorIndex
from haiku.rag.store.base import Store, StoreSettings
from haiku.rag.store.yaml import YamlStore, delete_store

DIM = 8
WHEN = datetime(2024, 5, 6, 7, 8, 9, 101112, tzinfo=UTC)
NASTY = (
    'quotes " and \\ backslash, tab\t, CRLF\r\n, NUL \x00, DEL \x7f, NEL \x85, '
    "LS \u2028, PS \u2029, BOM \ufeff, nonchar \ufffe, emoji 😀, accents café, "
    "yaml syntax: - [a, b] {c: d} # not a comment & *alias !tag %directive `tick` "
    "'single' | > ---  ... @ ,"
)


def settings(dim: int = DIM) -> StoreSettings:
    return StoreSettings(
        driver="yaml",
        embedding_model="test:fixed",
        embedding_dim=dim,
        chunk_size=300,
        chunk_overlap=10,
    )


def make_document(
    uri: str, texts: list[str], seed: int = 0, dim: int = DIM, **extra: Any
) -> tuple[Document, list[Chunk], np.ndarray]:
    document = Document.from_text("\n\n".join(texts), uri=uri, **extra).model_copy(
        update={"created_at": WHEN, "updated_at": WHEN}
    )
    chunks = [
        Chunk(
            id=chunk_id_for(document.id, i, text),
            document_id=document.id,
            order=i,
            content=text,
            start=i * 7,
            headings=[f"H{i}", "Sub"],
        )
        for i, text in enumerate(texts)
    ]
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((len(texts), dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return document, chunks, vectors


def add(store: Store, uri: str, texts: list[str], seed: int = 0, **extra: Any):
    document, chunks, vectors = make_document(
        uri, texts, seed, store.settings.embedding_dim, **extra
    )
    store.write([document], chunks, vectors)
    return document, chunks, vectors


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "kb.yaml"


@pytest.fixture
def store(path: Path) -> YamlStore:
    store = YamlStore.create(path, settings())
    add(
        store,
        "file:///a.md",
        ["alpha beta gamma", "delta epsilon"],
        seed=1,
        title="A",
        metadata={"tags": ["x", "y"], "n": 1, "ok": True, "none": None},
    )
    add(store, "file:///b.md", [NASTY, "zeta eta theta"], seed=2, title="B ✓")
    return store


def state_of(store: YamlStore) -> dict[str, Any]:
    documents = store.list_documents()
    return {
        "documents": [d.model_dump() for d in documents],
        "chunks": [[c.model_dump() for c in store.document_chunks(d.id)] for d in documents],
        "vectors": store._current().matrix.tolist(),
        "graph": store.load_graph(),
        "settings": store.settings,
    }


# -- selection and layout -------------------------------------------------------------------


def test_registry_picks_yaml_by_suffix_or_name() -> None:
    assert infer_driver("kb.yaml") == "yaml"
    assert infer_driver("KB.YML") == "yaml"
    assert infer_driver("kb.lancedb", "yaml") == "yaml"
    assert driver_class("yaml") is YamlStore
    assert isinstance(YamlStore.create.__doc__, str)


def test_file_is_plain_yaml_with_the_documented_layout(store: YamlStore, path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# haiku.rag knowledge base")
    data = yaml.safe_load(text)
    assert list(data) == ["haiku_rag", "settings", "graph", "documents", "chunks"]
    assert data["haiku_rag"] == {"format": 1, "driver": "yaml"}
    assert data["settings"] == settings().model_dump(mode="json")
    assert data["graph"] is None
    assert [d["uri"] for d in data["documents"]] == ["file:///a.md", "file:///b.md"]
    assert set(data["documents"][0]) == {
        "id",
        "uri",
        "title",
        "content",
        "metadata",
        "content_hash",
        "created_at",
        "updated_at",
    }
    chunk = data["chunks"][0]
    assert set(chunk) == {"id", "document_id", "order", "start", "headings", "content", "vector"}
    vector = np.frombuffer(binascii.a2b_base64(chunk["vector"]), dtype="<f4")
    np.testing.assert_array_equal(vector, store._current().matrix[0])
    assert data["chunks"][2]["content"] == NASTY  # a YAML parser reads the same text
    # one line per document and per chunk
    lines = text.splitlines()
    assert sum(line.startswith("  {") for line in lines) == 2 + 4


def test_yaml_reader_and_fast_reader_agree(store: YamlStore, path: Path) -> None:
    fast = state_of(YamlStore.open(path))
    data = path.read_bytes()
    variants = {
        "document marker": b"---\n" + data,
        "block style": yaml.safe_dump(yaml.safe_load(data), allow_unicode=True).encode(),
        "binary vectors": _binary_vectors(data),
    }
    for name, variant in variants.items():
        other = path.with_name(f"variant-{name.replace(' ', '-')}.yaml")
        other.write_bytes(variant)
        assert state_of(YamlStore.open(other)) == fast, name


def _binary_vectors(data: bytes) -> bytes:
    """The same store with vectors as `!!binary` nodes, as a YAML tool might write them."""
    loaded = yaml.safe_load(data)
    for chunk in loaded["chunks"]:
        chunk["vector"] = binascii.a2b_base64(chunk["vector"])
    return yaml.safe_dump(loaded, allow_unicode=True).encode()


def test_crlf_line_endings_still_read_fast(
    store: YamlStore, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = state_of(store)
    crlf = path.with_name("crlf.yaml")
    crlf.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    monkeypatch.setattr(yaml_store, "_parse_yaml", _fail)
    assert state_of(YamlStore.open(crlf)) == expected


def test_file_without_final_newline(
    store: YamlStore, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = state_of(store)
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    monkeypatch.setattr(yaml_store, "_parse_yaml", _fail)
    assert state_of(YamlStore.open(path)) == expected


def _fail(*args: Any) -> Any:
    raise AssertionError("the YAML reader should not be needed")


def test_empty_store_layout(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    YamlStore.create(path, settings()).close()
    text = path.read_text()
    assert "documents: []\n" in text and "chunks: []\n" in text
    monkeypatch.setattr(yaml_store, "_parse_yaml", _fail)
    store = YamlStore.open(path)
    assert store.count_documents() == 0 and store.count_chunks() == 0
    assert store.vector_search(np.ones(DIM, dtype=np.float32), 3) == []
    assert store.keyword_search("anything", 3) == []


def test_dimensions_needing_base64_padding(tmp_path: Path) -> None:
    for dim in (1, 2, 5, 7):  # 4*dim bytes not a multiple of 3: '=' padding per vector
        file = tmp_path / f"d{dim}.yaml"
        store = YamlStore.create(file, settings(dim))
        add(store, "file:///x.md", ["one", "two", "three"], seed=dim)
        expected = state_of(store)
        assert state_of(YamlStore.open(file)) == expected


def test_metadata_types_round_trip(path: Path) -> None:
    store = YamlStore.create(path, settings())
    metadata = {
        "float": 1.5,
        "small": 1e-05,
        "big": 12345678901234567890,
        "nested": {"a": [1]},
        "path": "C:\\dir",
        "date": "2024-01-01",
    }
    document, _, _ = add(store, "file:///m.md", ["text"], metadata=metadata)
    again = YamlStore.open(path).get_document(document.id)
    assert again is not None and again.metadata == metadata


# -- errors ---------------------------------------------------------------------------------


def test_open_missing_says_how_to_create(path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match="create=True"):
        YamlStore.open(path)


def test_unreadable_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path.write_text("x")

    def denied(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(yaml_store, "_read", denied)
    with pytest.raises(StoreError, match="Cannot read"):
        YamlStore.open(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"embeddings:\n  model: hash:v1\n", "no `haiku_rag` header"),
        (b"haiku_rag: [unclosed\n", "not valid YAML at line"),
        (b"- haiku_rag\n- list\n", "no `haiku_rag` header"),
        (b"haiku_rag: 3\nsettings: {}\n", "no `haiku_rag` header"),
        (b"\x00\x01haiku_rag\xff\xfe binary", "not valid YAML"),
    ],
)
def test_not_a_haiku_store(path: Path, content: bytes, message: str) -> None:
    path.write_bytes(content)
    with pytest.raises(StoreError, match=message) as raised:
        YamlStore.open(path)
    assert str(path) in str(raised.value)


def _rewrite(path: Path, change: Any) -> None:
    data = yaml.safe_load(path.read_bytes())
    change(data)
    path.write_text(yaml.safe_dump(data, allow_unicode=True))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["haiku_rag"].update(format=2), "format 2, newer"),
        (lambda d: d["settings"].update(format_version=9), "format 9, newer"),
        (lambda d: d["settings"].pop("embedding_dim"), "settings: embedding_dim"),
        (lambda d: d.update(documents={"a": 1}), "`documents` is not a list"),
        (lambda d: d["documents"][0].pop("uri"), "documents item 0: uri"),
        (lambda d: d["chunks"][1].update(order="first"), "chunks item 1: order"),
        (lambda d: d["chunks"][0].update(vector="***"), "chunks item 0: vector missing"),
        (lambda d: d["chunks"][0].pop("vector"), "chunks item 0: vector missing"),
        (lambda d: d["chunks"][3].update(vector="AAAA"), "chunks item 3: vector has 0 values"),
        (lambda d: d["documents"].append(d["documents"][0]), "appears twice"),
        (lambda d: d["chunks"].append(d["chunks"][0]), "appears twice"),
        (lambda d: d["chunks"][0].update(document_id="ghost"), "document ghost, not listed"),
        (lambda d: d.update(graph=[1, 2]), "`graph` is not a mapping"),
    ],
)
def test_damaged_files_name_the_problem(
    store: YamlStore, path: Path, change: Any, message: str
) -> None:
    _rewrite(path, change)
    with pytest.raises(StoreError, match=message) as raised:
        YamlStore.open(path)
    assert str(path) in str(raised.value)


def test_fast_reader_hands_damage_to_the_yaml_reader(store: YamlStore, path: Path) -> None:
    """A canonical-looking file with a bad value still gets the precise message."""
    data = path.read_bytes()
    broken = data.replace(b'"order": 1', b'"order": "x"', 1)
    assert broken != data
    path.write_bytes(broken)
    with pytest.raises(StoreError, match="order"):
        YamlStore.open(path)
    path.write_bytes(data.replace(b'"vector": "', b'"vector": "!', 1))
    with pytest.raises(StoreError, match="vector missing or not base64"):
        YamlStore.open(path)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.replace(b"graph: null\n", b"graph: null\ngraph: null\n"),
        lambda d: d.replace(b"graph: null\n", b"unknown: 1\n"),
        lambda d: d.replace(b"graph: null\n", b"graph\n"),
        lambda d: d.replace(b"graph: null\n", b"graph: {bad json: yes}\n"),
        lambda d: d.replace(b"\n  ]\n", b"\n  ]  # trailing\n"),
        lambda d: d.replace(b"\n  ]\n", b"\n]\n"),
        lambda d: b"---\n" + d,
        lambda d: d.replace(b"documents: [", b"- stray\ndocuments: ["),
        lambda d: d.replace(b"documents: [\n", b"documents: [ \n", 1) + b"#",
        lambda d: d.replace(b'"vector": "', b'"vector": "AAAA', 1),
    ],
)
def test_non_canonical_but_valid_files_use_the_yaml_reader(
    store: YamlStore, path: Path, mutate: Any
) -> None:
    data = path.read_bytes()
    changed = mutate(data)
    assert changed != data
    path.write_bytes(changed)
    try:
        reopened = YamlStore.open(path)
    except StoreError as error:  # the change made the file invalid: a clear error
        assert str(path) in str(error)
    else:
        assert reopened.count_documents() == 2


def test_fast_reader_rejects_odd_shapes_directly() -> None:
    file = Path("x.yaml")
    odd = [
        b"documents: [\n  {}\n",  # unterminated section
        b"documents: [\n  {}\n  ] x\n",  # text after the closing bracket
        b"documents: {}\n",  # not a list
        b"- item before any key\n",
    ]
    for data in odd:
        with pytest.raises(yaml_store._NotCanonical):
            yaml_store._parse_fast(file, data)


def test_other_drivers_files_say_how_to_switch(tmp_path: Path) -> None:
    lance = tmp_path / "kb.lancedb"
    (lance / "settings.lance").mkdir(parents=True)
    with pytest.raises(StoreError, match=r"lancedb store.*driver='lancedb'.*add your documents"):
        YamlStore.open(lance)
    plain_dir = tmp_path / "folder.yaml"
    plain_dir.mkdir()
    with pytest.raises(StoreError, match="is a directory"):
        YamlStore.open(plain_dir)
    sidecar = tmp_path / "side.yaml"
    sidecar.write_text(
        'haiku_rag: {"format": 1, "driver": "duckdb", "database": "side.duckdb"}\n'
        'settings: {"driver": "duckdb", "embedding_model": "m:x", "embedding_dim": 4, '
        '"chunk_size": 10, "chunk_overlap": 1}\ndocuments: []\n'
    )
    with pytest.raises(StoreError, match=r"duckdb store.*driver='duckdb'.*add your documents"):
        YamlStore.open(sidecar)
    database = tmp_path / "data.duckdb"
    database.write_bytes(b"DUCK\x00\x01 binary")
    with pytest.raises(StoreError, match=r"looks like a duckdb store.*add your documents"):
        YamlStore.open(database)


def test_create_refuses(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="driver='yaml'"):
        YamlStore.create(tmp_path / "a.yaml", settings().model_copy(update={"driver": "lancedb"}))
    with pytest.raises(StoreError, match="names a lancedb store"):
        YamlStore.create(tmp_path / "a.lancedb", settings())
    existing = tmp_path / "exists.yaml"
    existing.write_text("mine")
    with pytest.raises(StoreError, match="already exists"):
        YamlStore.create(existing, settings())
    assert existing.read_text() == "mine"
    (tmp_path / "twin.duckdb").write_bytes(b"db")
    with pytest.raises(StoreError, match="duckdb store whose settings file is missing"):
        YamlStore.create(tmp_path / "twin.yaml", settings())
    with pytest.raises(StoreError, match="does not exist"):
        YamlStore.create(tmp_path / "missing" / "kb.yaml", settings())
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(StoreError, match="directory"):
        YamlStore.create(tmp_path / "dir.yaml", settings())


def test_create_race_and_filesystems_without_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_link = os.link

    def appears_meanwhile(src: str, dst: Path) -> None:
        Path(dst).write_text("someone else")
        real_link(src, dst)

    monkeypatch.setattr(os, "link", appears_meanwhile)
    with pytest.raises(StoreError, match="already exists"):
        YamlStore.create(tmp_path / "race.yaml", settings())
    assert (tmp_path / "race.yaml").read_text() == "someone else"

    def unsupported(src: str, dst: Path) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", unsupported)
    YamlStore.create(tmp_path / "nolinks.yaml", settings()).close()
    assert YamlStore.open(tmp_path / "nolinks.yaml").count_documents() == 0

    def unsupported_and_raced(src: str, dst: Path) -> None:
        Path(dst).write_text("raced")
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", unsupported_and_raced)
    with pytest.raises(StoreError, match="already exists"):
        YamlStore.create(tmp_path / "raced.yaml", settings())
    assert [p for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_new_file_mode_follows_umask_and_rewrites_keep_it(path: Path) -> None:
    old = os.umask(0o027)
    try:
        store = YamlStore.create(path, settings())
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    path.chmod(0o604)
    add(store, "file:///a.md", ["text"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o604


# -- writes -----------------------------------------------------------------------------------


def test_read_only_and_closed(store: YamlStore, path: Path) -> None:
    reader = YamlStore.open(path, read_only=True)
    assert "read-only" in repr(reader) and "writable" in repr(store)
    assert reader.features.writable is True  # what the driver can do; the handle is read-only
    document, chunks, vectors = make_document("file:///c.md", ["c"])
    for attempt in (
        lambda: reader.write([document], chunks, vectors),
        lambda: reader.delete_documents([document.id]),
        lambda: reader.save_graph({}),
    ):
        with pytest.raises(ReadOnlyError, match="read_only=False"):
            attempt()
    with YamlStore.open(path) as handle:
        assert handle.count_documents() == 2
    with pytest.raises(StoreError, match="closed"):
        handle.count_chunks()
    with pytest.raises(StoreError, match="closed"):
        handle.write([document], chunks, vectors)


def test_failed_writes_leave_file_and_memory_intact(
    store: YamlStore, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before_state, before_bytes = state_of(store), path.read_bytes()
    document, chunks, vectors = make_document("file:///c.md", ["c1", "c2"])

    def full_disk(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(StoreError, match="No space left"):
        store.write([document], chunks, vectors)
    monkeypatch.undo()

    def no_temp(*args: Any, **kwargs: Any) -> Any:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(yaml_store.tempfile, "mkstemp", no_temp)
    with pytest.raises(StoreError, match="Read-only file system"):
        store.delete_documents([store.list_documents()[0].id])
    monkeypatch.undo()
    with pytest.raises(StoreError, match="JSON-serialisable"):
        store.save_graph({"when": object()})
    with pytest.raises(StoreError, match="JSON-serialisable"):
        store.save_graph({"nan": float("nan")})
    with pytest.raises(StoreError, match="must be a mapping"):
        store.save_graph([1, 2])  # type: ignore[arg-type]
    assert state_of(store) == before_state
    assert path.read_bytes() == before_bytes
    assert [p for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_chunk_ids_are_unique_across_documents(store: YamlStore) -> None:
    a = store.list_documents()[0]
    stolen = store.document_chunks(a.id)[0]
    other = Document.from_text("other", uri="file:///other.md")
    chunk = stolen.model_copy(update={"document_id": other.id})
    with pytest.raises(StoreError, match="already belongs to document"):
        store.write([other], [chunk], np.ones((1, DIM), dtype=np.float32))


def test_writers_in_two_handles_keep_each_others_changes(store: YamlStore, path: Path) -> None:
    """Last-writer-wins is avoided: a write reloads the file if another writer changed it."""
    other = YamlStore.open(path)
    add(store, "file:///c.md", ["from the first handle"], seed=3)
    add(other, "file:///d.md", ["from the second handle"], seed=4)
    assert other.count_documents() == 4
    assert YamlStore.open(path).count_documents() == 4
    assert store.count_documents() == 3  # a reader keeps its snapshot until it writes
    assert store.delete_documents([Document.from_text("x", uri="file:///c.md").id]) == 1
    assert {d.uri for d in store.list_documents()} == {
        "file:///a.md",
        "file:///b.md",
        "file:///d.md",
    }
    other.save_graph({"nodes": [1]})
    assert store.delete_documents(["unknown"]) == 0  # nothing to do, but now up to date
    assert store.load_graph() == {"nodes": [1]}
    assert store.keyword_search("second handle", 3)


def test_write_waits_for_the_file_lock_and_follows_a_replaced_file(
    store: YamlStore, path: Path
) -> None:
    import fcntl
    import shutil

    holder = os.open(path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            add(store, "file:///late.md", ["written after the wait"], seed=5)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    thread = threading.Thread(target=write)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()  # waiting for the lock
    # meanwhile a new version of the file is renamed into place
    newer = path.with_name("newer.yaml")
    shutil.copy(path, newer)
    add(YamlStore.open(newer), "file:///meanwhile.md", ["replaced while waiting"], seed=6)
    os.replace(newer, path)
    fcntl.flock(holder, fcntl.LOCK_UN)
    os.close(holder)
    thread.join(10)
    assert not errors and not thread.is_alive()
    uris = {d.uri for d in YamlStore.open(path).list_documents()}
    assert {"file:///late.md", "file:///meanwhile.md"} <= uris


def test_deleted_store_file(store: YamlStore, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path.unlink()
    with pytest.raises(StoreError, match="was deleted while open"):
        add(store, "file:///c.md", ["c"])
    assert store.count_documents() == 2
    YamlStore.create(path, settings()).close()
    real_stat = os.stat

    def vanishing(target: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(target) == path:
            raise FileNotFoundError(target)
        return real_stat(target, *args, **kwargs)

    monkeypatch.setattr(os, "stat", vanishing)
    with pytest.raises(StoreError, match="was deleted while open"):
        add(store, "file:///c.md", ["c"])


def test_unchanged_chunks_are_not_reencoded(
    store: YamlStore, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(store, "file:///c.md", ["warm the cache"], seed=7)
    calls = []
    real = yaml_store._chunk_item

    def counting(row: Any, vector: Any) -> bytes:
        calls.append(row["id"])
        return real(row, vector)

    monkeypatch.setattr(yaml_store, "_chunk_item", counting)
    document, chunks, _ = add(store, "file:///d.md", ["new one", "new two"], seed=8)
    assert sorted(calls) == sorted(c.id for c in chunks)
    # the same chunk written again with another vector is re-encoded, not served stale
    calls.clear()
    store.write([document], chunks, np.ones((2, DIM), dtype=np.float32) / np.sqrt(DIM))
    assert sorted(calls) == sorted(c.id for c in chunks)
    reopened = YamlStore.open(path)
    np.testing.assert_allclose(
        reopened._current().matrix[-1], np.ones(DIM) / np.sqrt(DIM), rtol=1e-6
    )


def test_cache_is_not_trusted_after_another_writer(store: YamlStore, path: Path) -> None:
    """Another process re-embedding the same chunks (same ids, new vectors) wins."""
    document, chunks, _ = add(store, "file:///c.md", ["re-embedded later"], seed=13)
    other = YamlStore.open(path)
    other.write([document], chunks, np.full((1, DIM), 1 / np.sqrt(DIM), dtype=np.float32))
    add(store, "file:///d.md", ["unrelated"], seed=14)  # reloads, then rewrites everything
    reopened = YamlStore.open(path)
    row = reopened._current().rows[chunks[0].id]
    np.testing.assert_allclose(reopened._current().matrix[row], 1 / np.sqrt(DIM), rtol=1e-6)


def test_search_indexes_follow_writes(store: YamlStore, path: Path) -> None:
    assert store.keyword_search("zeta", 3)  # builds the keyword index
    add(store, "file:///c.md", ["omega psi chi"], seed=9)
    assert store.keyword_search("omega", 3)
    assert store.delete_documents([store.list_documents()[1].id]) == 1
    assert store.keyword_search("zeta", 3) == []
    _, _, vectors = make_document("file:///c.md", ["omega psi chi"], seed=9)
    assert store.vector_search(vectors[0], 1)[0][1] == pytest.approx(1.0, abs=1e-6)
    # a reload (another writer changed the file) rebuilds both indexes
    add(YamlStore.open(path), "file:///d.md", ["sigma tau"], seed=10)
    add(store, "file:///e.md", ["upsilon phi"], seed=11)
    assert store.keyword_search("sigma", 3) and store.keyword_search("upsilon", 3)


def test_vector_index_is_built_per_state(store: YamlStore) -> None:
    state = store._current()
    first = store._vector_index(state)
    assert store._vector_index(state) is first
    add(store, "file:///c.md", ["more"], seed=12)
    assert store._vector_index(store._current()) is not first
    assert store._vector_index(state) is not first  # an old state gets a private index


def test_delete_store(tmp_path: Path, store: YamlStore, path: Path) -> None:
    with pytest.raises(StoreNotFoundError):
        delete_store(tmp_path / "missing.yaml")
    other = tmp_path / "notes.yaml"
    other.write_text("just: notes\n")
    with pytest.raises(StoreError, match="refusing"):
        delete_store(other)
    delete_store(path)
    assert not path.exists() and other.exists()


def test_killed_writer_leaves_a_readable_store(store: YamlStore, path: Path) -> None:
    """A crash after the temp file is written but before the rename loses nothing."""
    before = path.read_bytes()
    stray = path.with_name(f".{path.name}.12345.tmp")
    stray.write_bytes(before[: len(before) // 2])
    assert YamlStore.open(path).count_documents() == 2


# -- the vector helper ---------------------------------------------------------------------


def _unit_rows(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((n, dim)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def test_vector_index_exact_matches_brute_force() -> None:
    matrix = _unit_rows(300, 16, 1)
    ids = [f"c{i:04d}" for i in range(300)]
    groups = [f"d{i % 7}" for i in range(300)]
    index = VectorIndex(ids, groups, matrix)
    assert len(index) == 300 and index.dim == 16 and not index.uses_hnsw
    for query in _unit_rows(5, 16, 2):
        scores = matrix @ query
        expected = sorted(zip(ids, scores.tolist(), strict=True), key=lambda p: (-p[1], p[0]))
        got = index.search(query, 10)
        assert [c for c, _ in got] == [c for c, _ in expected[:10]]
        allowed = {"d1", "d3"}
        filtered = [p for p in expected if groups[ids.index(p[0])] in allowed]
        assert [c for c, _ in index.search(query, 4, allowed)] == [c for c, _ in filtered[:4]]
    assert len(index.search(_unit_rows(1, 16, 3)[0], 1000)) == 300
    assert index.search(matrix[0], 0) == []
    assert index.search(matrix[0], 3, []) == []
    assert index.search(matrix[0], 3, ["nope"]) == []
    with pytest.raises(ValueError, match="dimensions"):
        index.search(np.ones(3, dtype=np.float32), 3)
    with pytest.raises(ValueError, match="one id"):
        VectorIndex(ids[:2], groups[:1], matrix[:2])
    assert VectorIndex([], [], np.zeros((0, 4), dtype=np.float32)).search(np.ones(4), 3) == []


def test_vector_index_ties_are_broken_by_id() -> None:
    matrix = np.tile(_unit_rows(1, 8, 4), (6, 1))
    ids = ["f", "b", "e", "a", "d", "c"]
    index = VectorIndex(ids, ["g"] * 6, matrix)
    assert [c for c, _ in index.search(matrix[0], 3)] == ["a", "b", "c"]


def test_hnsw_is_built_after_enough_exact_queries() -> None:
    matrix = _unit_rows(2000, 16, 5)
    ids = [f"c{i:05d}" for i in range(2000)]
    groups = [f"d{i // 10}" for i in range(2000)]
    index = VectorIndex(ids, groups, matrix, hnsw_min_rows=500, hnsw_after_queries=3)
    queries = _unit_rows(20, 16, 6)
    exact = [index.search(q, 5) for q in queries[:3]]
    assert not index.uses_hnsw and index.exact_queries == 3
    assert [c for c, _ in index.search(queries[0], 5)] == [c for c, _ in exact[0]]
    assert index.uses_hnsw
    index.build_hnsw()  # idempotent
    reference = VectorIndex(ids, groups, matrix, hnsw_min_rows=10**9)
    recall = 0
    for query in queries:
        got, want = index.search(query, 10), reference.search(query, 10)
        recall += len({c for c, _ in got} & {c for c, _ in want})
        for chunk_id, score in got:  # candidates are re-scored exactly
            assert score == pytest.approx(float(matrix[ids.index(chunk_id)] @ query), abs=1e-5)
    assert recall >= 0.95 * 10 * len(queries)
    # a big filter goes through the graph (with a filter), a small one is exact
    big = {f"d{i}" for i in range(0, 200, 2)}
    assert [c for c, _ in index.search(queries[1], 5, big)] == [
        c for c, _ in reference.search(queries[1], 5, big)
    ]
    small = {"d3"}
    assert [c for c, _ in index.search(queries[1], 5, small)] == [
        c for c, _ in reference.search(queries[1], 5, small)
    ]


def test_without_hnswlib_search_stays_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "hnswlib", None)
    matrix = _unit_rows(50, 8, 8)
    ids = [f"c{i:02d}" for i in range(50)]
    index = VectorIndex(ids, ["g"] * 50, matrix, hnsw_min_rows=10, hnsw_after_queries=0)
    expected = VectorIndex(ids, ["g"] * 50, matrix, hnsw_min_rows=10**9).search(matrix[1], 5)
    assert index.search(matrix[1], 5) == expected
    assert not index.uses_hnsw
    assert index.search(matrix[1], 5) == expected  # and it does not try again


def test_hnsw_filter_falling_short_uses_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    matrix = _unit_rows(600, 8, 7)
    ids = [f"c{i:04d}" for i in range(600)]
    groups = ["big"] * 590 + ["x"] * 10
    index = VectorIndex(ids, groups, matrix, hnsw_min_rows=100, hnsw_after_queries=0)
    index.build_hnsw()
    assert index._hnsw is not None

    class Failing:
        def set_ef(self, ef: int) -> None:
            pass

        def knn_query(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("Cannot return the results in a contiguous 2D array")

    monkeypatch.setattr(index, "_hnsw", Failing())
    expected = VectorIndex(ids, groups, matrix, hnsw_min_rows=10**9).search(matrix[0], 3, ["big"])
    assert index.search(matrix[0], 3, ["big"]) == expected


# -- the keyword helper ----------------------------------------------------------------------


def test_analyzer_mirrors_lancedb_defaults() -> None:
    tokens = analyzer().analyze("The RUNNING runners were Café's naïve x" + "y" * 45)
    assert tokens == ["run", "runner", "cafe", "naiv"]  # stop words, 's', 45-char token gone
    assert {"s", "t", "does", "the"} <= STOP_WORDS


def test_keyword_index_search_update_and_filter() -> None:
    index = KeywordIndex(
        [
            ("c1", "running dogs run fast", "d1"),
            ("c2", "cats run", "d2"),
            ("c3", "a run of bad luck", "d3"),
        ]
    )
    assert len(index) == 3
    ranked = index.search("run", 10)
    assert {c for c, _ in ranked} == {"c1", "c2", "c3"}
    assert ranked[0][0] == "c1"
    assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)
    filtered = index.search("run", 10, ["d2", "d3"])
    unfiltered = dict(ranked)
    assert {c for c, _ in filtered} == {"c2", "c3"}
    for chunk_id, score in filtered:
        assert score == pytest.approx(unfiltered[chunk_id])
    for query in ['"unbalanced', "AND OR NOT", "title:run", "run^2 (x", "*", "-run", "[a TO b]"]:
        index.search(query, 5)  # never a syntax error
    assert index.search("the of and", 5) == []
    assert index.search("run", 0) == []
    assert index.search("run", 5, []) == []
    assert index.terms("Runs!") == ["run"]
    index.update(remove_documents=["d1"], add=[("c4", "run run run", "d4")])
    assert len(index) == 3
    assert index.search("run", 1)[0][0] == "c4"
    assert "c1" not in {c for c, _ in index.search("run", 10)}
    index.update(remove_documents=["unknown"])
    assert len(index) == 3


def test_keyword_ties_are_ordered_by_chunk_id() -> None:
    index = KeywordIndex([(f"c{i}", "same words here", "d") for i in (5, 3, 9, 1)])
    assert [c for c, _ in index.search("words", 3)] == ["c1", "c3", "c5"]
