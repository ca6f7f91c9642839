"""DuckDB store across processes: readers or one writer, clear errors, no torn state.

Children are started with `spawn` (a fresh interpreter, as another program would be),
and every wait is bounded so a broken lock cannot hang the suite.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from haiku.rag.documents import Chunk, Document, chunk_id_for
from haiku.rag.store.base import StoreSettings
from haiku.rag.store.duckdb import DuckDBStore, StoreBusyError

DIM = 4
WAIT = 60.0
CTX = mp.get_context("spawn")


def settings() -> StoreSettings:
    return StoreSettings(
        driver="duckdb", embedding_model="test:fake", embedding_dim=DIM, chunk_size=200,
        chunk_overlap=10,
    )  # fmt: skip


def unit(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def add(store: DuckDBStore, uri: str, texts: list[str], vectors: list[np.ndarray]) -> Document:
    doc = Document.from_text("\n\n".join(texts), uri=uri)
    chunks = [
        Chunk(id=chunk_id_for(doc.id, i, t), document_id=doc.id, order=i, content=t)
        for i, t in enumerate(texts)
    ]
    store.write([doc], chunks, np.stack(vectors))
    return doc


@pytest.fixture
def path(tmp_path: Path) -> Path:
    path = tmp_path / "kb.duckdb"
    store = DuckDBStore.create(path, settings())
    add(store, "a.md", ["apples grow in orchards", "orchids flower"], [unit(1, 0, 0, 0)] * 2)
    add(store, "b.md", ["bread needs an oven"], [unit(0, 1, 0, 0)])
    store.close()
    return path


def run(target: Any, *args: Any) -> mp.process.BaseProcess:
    process = CTX.Process(target=target, args=args, daemon=True)
    process.start()
    return process


def finish(*processes: mp.process.BaseProcess) -> None:
    for process in processes:
        process.join(WAIT)
        if process.is_alive():  # pragma: no cover - only when a lock is broken
            process.kill()
            raise AssertionError("a child process hung")


# -- children (module level, so spawn can import them) -----------------------------------------


def slow_writer(path: str, committed: Any, release: Any) -> None:
    """Write one document, pausing between the database commit and the sidecar rename
    (the write lock held all along) until the parent has probed the store."""
    from haiku.rag.store import duckdb as driver

    real = driver._publish

    def paused(temp: Path, file: Path) -> None:
        committed.set()
        release.wait(WAIT)
        real(temp, file)

    driver._publish = paused
    store = DuckDBStore.open(path)
    add(store, "c.md", ["cherries are red"], [unit(0, 0, 1, 0)])
    store.close()


def holding_reader(path: str, ready: Any, release: Any, idle: float | None) -> None:
    store = DuckDBStore.open(path, read_only=True)
    store.idle_release = idle
    store.vector_search(unit(1, 0, 0, 0), 3)
    ready.set()
    release.wait(WAIT)
    store.close()


def parallel_reader(path: str, barrier: Any, results: Any) -> None:
    store = DuckDBStore.open(path, read_only=True)
    store.idle_release = None
    store.count_chunks()  # the read connection is open from here on
    barrier.wait(WAIT)  # every reader holds its connection at the same time
    outcome = []
    for _ in range(20):
        outcome.append(
            (
                tuple(cid for cid, _ in store.vector_search(unit(1, 0.2, 0, 0), 3)),
                tuple(cid for cid, _ in store.keyword_search("orchards", 3)),
                store.count_chunks(),
            )
        )
    barrier.wait(WAIT)
    store.close()
    results.put(sorted(set(outcome)))


def killed_writer(path: str, stage: str) -> None:
    """Write, then die without closing: after the commit, or in the middle of it."""
    from haiku.rag.store import duckdb as driver

    if stage == "mid-transaction":
        real = driver._set_meta

        def die(con: Any, key: str, value: str) -> None:
            if key == "fts_dirty":
                os._exit(3)
            real(con, key, value)

        driver._set_meta = die
    store = DuckDBStore.open(path)
    add(store, "c.md", ["cherries are red"], [unit(0, 0, 1, 0)])
    os._exit(0)


# -- tests ----------------------------------------------------------------------------------


def test_a_reader_during_a_write_gets_a_clear_error_then_the_new_state(path: Path):
    reader = DuckDBStore.open(path, read_only=True, lock_timeout=0.2)
    reader.idle_release = 0.05
    assert reader.count_documents() == 2
    committed, release = CTX.Event(), CTX.Event()
    writer = run(slow_writer, str(path), committed, release)
    try:
        assert committed.wait(WAIT)
        time.sleep(0.2)  # the idle reader has let its connection go
        with pytest.raises(StoreBusyError, match=r"being written by another process \(PID \d+\)"):
            reader.vector_search(unit(1, 0, 0, 0), 3)
        with pytest.raises(StoreBusyError, match="try again"):
            DuckDBStore.open(path, read_only=True, lock_timeout=0.2)
    finally:
        release.set()
        finish(writer)
    assert writer.exitcode == 0
    assert reader.count_documents() == 3
    assert {
        c.content for c in reader.get_chunks([reader.vector_search(unit(0, 0, 1, 0), 1)[0][0]])
    } == {"cherries are red"}
    assert all(reader.document_hashes().values())
    reader.close()


def test_a_reader_waits_out_a_short_write(path: Path):
    committed, release = CTX.Event(), CTX.Event()
    writer = run(slow_writer, str(path), committed, release)
    try:
        assert committed.wait(WAIT)
        threads_release = time.monotonic()
        release.set()
        reader = DuckDBStore.open(path, read_only=True, lock_timeout=30)
        assert time.monotonic() - threads_release < 30
        assert reader.count_documents() == 3
        reader.close()
    finally:
        release.set()
        finish(writer)


def test_several_readers_in_parallel(path: Path):
    barrier, results = CTX.Barrier(3), CTX.Queue()
    readers = [run(parallel_reader, str(path), barrier, results) for _ in range(3)]
    outcomes = [results.get(timeout=WAIT) for _ in readers]
    finish(*readers)
    assert [r.exitcode for r in readers] == [0, 0, 0]
    assert all(len(outcome) == 1 for outcome in outcomes)  # every call, the same answer
    assert outcomes[0] == outcomes[1] == outcomes[2]
    ((vector, keyword, chunks),) = outcomes[0]
    assert chunks == 3 and len(vector) == 3 and len(keyword) == 1


def test_a_writer_blocked_by_a_reader_gets_a_clear_error(path: Path):
    ready, release = CTX.Event(), CTX.Event()
    reader = run(holding_reader, str(path), ready, release, None)
    writer = DuckDBStore.open(path, lock_timeout=0.2)
    try:
        assert ready.wait(WAIT)
        with pytest.raises(StoreBusyError, match=r"being read by another process \(PID \d+\)"):
            add(writer, "c.md", ["cherries"], [unit(0, 0, 1, 0)])
        assert writer.count_documents() == 2  # reading alongside the other reader works
    finally:
        release.set()
        finish(reader)
    writer._release_reader()
    add(writer, "c.md", ["cherries"], [unit(0, 0, 1, 0)])
    assert writer.count_documents() == 3
    writer.close()


def test_an_idle_reader_lets_a_writer_in(path: Path):
    ready, release = CTX.Event(), CTX.Event()
    reader = run(holding_reader, str(path), ready, release, 0.2)
    try:
        assert ready.wait(WAIT)
        writer = DuckDBStore.open(path, lock_timeout=20)
        writer.idle_release = None
        add(writer, "c.md", ["cherries"], [unit(0, 0, 1, 0)])  # waits for the idle release
        assert writer.count_documents() == 3
        writer.close()
    finally:
        release.set()
        finish(reader)


def test_a_writer_killed_after_commit_leaves_the_new_state_readable(path: Path):
    store = DuckDBStore.open(path)
    store.hnsw_min_chunks = 1
    store.optimize()  # with an index, writes stay in the WAL until the session ends
    store.close()
    child = run(killed_writer, str(path), "after-commit")
    finish(child)
    assert child.exitcode == 0
    assert path.with_name(path.name + ".wal").exists()
    with pytest.warns(UserWarning, match="keyword index"):
        reader = DuckDBStore.open(path, read_only=True)
        assert reader.count_documents() == 3 and reader.count_chunks() == 4
        hit = reader.vector_search(unit(0, 0, 1, 0), 1)[0][0]
        assert reader.get_chunks([hit])[0].content == "cherries are red"
        assert reader.keyword_search("cherries", 3) == []  # index not rebuilt yet
    reader.close()
    writer = DuckDBStore.open(path)
    assert [c for c, _ in writer.keyword_search("cherries", 3)] == [hit]
    writer.close()
    assert not path.with_name(path.name + ".wal").exists()


def test_a_writer_killed_mid_transaction_leaves_the_previous_state(path: Path):
    child = run(killed_writer, str(path), "mid-transaction")
    finish(child)
    assert child.exitcode == 3
    reader = DuckDBStore.open(path, read_only=True)
    assert reader.count_documents() == 2 and reader.count_chunks() == 3
    assert all(reader.document_hashes().values())
    reader.close()
