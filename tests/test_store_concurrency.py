"""The yaml store across processes: readers never see a half-written file, writers never
lose each other's changes, and a writer killed mid-write leaves a readable store.

Every write below is one `Store.write` that moves the store from generation g to g + 1:
it replaces a marker document (whose metadata names g + 1 and its chunk count) and adds
one document. A reader that opens the file checks that the counts it sees agree with
the marker it sees, so any mix of two versions would be caught.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from haiku.rag.documents import Chunk, Document, chunk_id_for
from haiku.rag.store.base import StoreSettings
from haiku.rag.store.yaml import YamlStore

DIM = 64
BASE_DOCUMENTS = 150
CHUNKS_PER_BASE = 4
MARKER_URI = "file:///marker.md"
MARKER_ID = Document.from_text("", uri=MARKER_URI).id
CONTEXT = multiprocessing.get_context("spawn")


def _settings() -> StoreSettings:
    return StoreSettings(
        driver="yaml",
        embedding_model="test:fixed",
        embedding_dim=DIM,
        chunk_size=300,
        chunk_overlap=10,
    )


def _vectors(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _document(uri: str, texts: list[str], metadata: dict[str, Any] | None = None):
    document = Document.from_text("\n\n".join(texts), uri=uri, metadata=metadata)
    chunks = [
        Chunk(id=chunk_id_for(document.id, i, text), document_id=document.id, order=i, content=text)
        for i, text in enumerate(texts)
    ]
    return document, chunks


def _generation(store: YamlStore, generation: int, tag: str = "") -> None:
    """One atomic step: marker -> `generation`, plus one new document."""
    count = generation % 5 + 1
    marker, marker_chunks = _document(
        MARKER_URI,
        [f"generation {generation} part {i}" for i in range(count)],
        {"generation": generation, "chunks": count},
    )
    extra, extra_chunks = _document(f"file:///gen{tag}-{generation}.md", [f"added in {generation}"])
    chunks = marker_chunks + extra_chunks
    store.write([marker, extra], chunks, _vectors(len(chunks), generation))


def _build(path: Path) -> None:
    store = YamlStore.create(path, _settings())
    documents, chunks = [], []
    for i in range(BASE_DOCUMENTS):
        texts = [
            f"base document {i} paragraph {j} " + "lorem ipsum " * 40
            for j in range(CHUNKS_PER_BASE)
        ]
        document, document_chunks = _document(f"file:///base/{i}.md", texts)
        documents.append(document)
        chunks.extend(document_chunks)
    store.write(documents, chunks, _vectors(len(chunks), 0))
    _generation(store, 0)
    store.close()


def _check(store: YamlStore) -> int:
    """The generation this snapshot is at; raises if the snapshot is not self-consistent."""
    marker = store.get_document(MARKER_ID)
    assert marker is not None, "marker missing"
    generation = marker.metadata["generation"]
    count = marker.metadata["chunks"]
    marker_chunks = store.document_chunks(MARKER_ID)
    assert len(marker_chunks) == count, (generation, len(marker_chunks), count)
    assert all(f"generation {generation} " in c.content for c in marker_chunks), generation
    assert store.count_documents() == BASE_DOCUMENTS + 2 + generation
    assert store.count_chunks() == BASE_DOCUMENTS * CHUNKS_PER_BASE + count + generation + 1
    hits = store.keyword_search(f"added in {generation}", 50)
    assert hits, generation
    assert store.vector_search(_vectors(1, 99)[0], 3)
    return int(generation)


def read_until_stopped(path: str, stop: Any, results: Any, minimum: int) -> None:
    """Reader process: open, check, repeat until told to stop."""
    seen: set[int] = set()
    reads = 0
    error = ""
    try:
        while not stop.is_set() or reads < minimum:
            store = YamlStore.open(path, read_only=True)
            seen.add(_check(store))
            store.close()
            reads += 1
    except BaseException as exc:  # report, do not hang the parent
        error = f"{type(exc).__name__}: {exc}"
    results.put((reads, sorted(seen), error))


def write_generations(path: str, first: int, last: int, tag: str = "") -> None:
    """Writer process: each generation is one atomic write."""
    store = YamlStore.open(path)
    for generation in range(first, last + 1):
        _generation(store, generation, tag)
        time.sleep(0.001)
    store.close()


def add_documents(path: str, tag: str, count: int) -> None:
    """Writer process for the lost-update test: documents only this process adds."""
    store = YamlStore.open(path)
    for i in range(count):
        document, chunks = _document(f"file:///{tag}/{i}.md", [f"{tag} number {i}"])
        store.write([document], chunks, _vectors(1, i))
    store.close()


@pytest.fixture
def built(tmp_path: Path) -> Path:
    path = tmp_path / "shared.yaml"
    _build(path)
    return path


def test_readers_see_complete_versions_while_a_writer_rewrites(built: Path) -> None:
    generations = 30
    stop = CONTEXT.Event()
    results = CONTEXT.Queue()
    readers = [
        CONTEXT.Process(target=read_until_stopped, args=(str(built), stop, results, 5))
        for _ in range(2)
    ]
    for reader in readers:
        reader.start()
    writer = CONTEXT.Process(target=write_generations, args=(str(built), 1, generations))
    writer.start()
    writer.join(120)
    assert writer.exitcode == 0
    stop.set()
    outcomes = [results.get(timeout=120) for _ in readers]
    for reader in readers:
        reader.join(30)
    for reads, seen, error in outcomes:
        assert error == ""
        assert reads >= 5
        assert seen and seen[0] >= 0 and seen[-1] <= generations
    # between them the readers saw versions the writer produced while they read
    assert len({g for _, seen, _ in outcomes for g in seen}) >= 2
    final = YamlStore.open(built, read_only=True)
    assert _check(final) == generations


def test_concurrent_writers_keep_each_others_documents(built: Path) -> None:
    writers = [
        CONTEXT.Process(target=add_documents, args=(str(built), tag, 8)) for tag in ("x", "y")
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)
        assert writer.exitcode == 0
    store = YamlStore.open(built, read_only=True)
    uris = {d.uri for d in store.list_documents()}
    for tag in ("x", "y"):
        assert {f"file:///{tag}/{i}.md" for i in range(8)} <= uris
    assert store.count_documents() == BASE_DOCUMENTS + 2 + 16


def test_writer_killed_mid_write_leaves_a_consistent_store(built: Path) -> None:
    for attempt in range(3):
        writer = CONTEXT.Process(
            target=write_generations, args=(str(built), 1, 1000, f"k{attempt}")
        )
        writer.start()
        time.sleep(1.5 + 0.4 * attempt)  # spawn start-up, then somewhere inside a write
        assert writer.pid is not None
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(30)
        store = YamlStore.open(built, read_only=True)
        _check_after_kill(store)
        for leftover in built.parent.glob(f".{built.name}.*.tmp"):
            leftover.unlink()  # what a killed writer can leave behind: never the store


def _check_after_kill(store: YamlStore) -> None:
    marker = store.get_document(MARKER_ID)
    assert marker is not None
    assert len(store.document_chunks(MARKER_ID)) == marker.metadata["chunks"]
    assert store.count_chunks() == sum(
        len(store.document_chunks(d.id)) for d in store.list_documents()
    )
