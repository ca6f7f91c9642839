"""The portable driver: a whole knowledge base in one YAML file (`<name>.yaml` / `.yml`).

The file is one valid YAML document with these top-level keys::

    # haiku.rag knowledge base ...
    haiku_rag: {"format": 1, "driver": "yaml"}
    settings: {"driver": "yaml", "embedding_model": "hash:v1", "embedding_dim": 256, ...}
    graph: null
    documents: [
      {"id": "...", "uri": "...", "title": ..., "content_hash": "...", "created_at": ...,
       "updated_at": ..., "metadata": {...}, "content": "..."},
      ...
      ]
    chunks: [
      {"id": "...", "document_id": "...", "order": 0, "start": 0, "headings": [...],
       "content": "...", "vector": "<base64 of little-endian float32>"},
      ...
      ]

Each document and each chunk is one line (shown wrapped above), and each section
is a YAML flow sequence that is also a JSON array. Any YAML library reads the
file (`yaml.safe_load` gives the obvious dicts) and a diff shows which documents
changed. Why not block-style YAML: PyYAML, even with libyaml, builds Python
objects at ~150k scalars/s, so a store of 100k chunks of 384 dimensions took
~20 s to open. This driver reads its own files without a YAML parser: the few
top-level lines with `json`, and each section with one call of pydantic's Rust
JSON validator, which also decodes the base64 vectors. The same store opens in
about a second (`bench/drivers.py`). Files that do not have this exact shape
(hand-edited, written by another tool) are read with the YAML parser instead:
slower, same result. Strings are written as JSON with the few characters that
YAML forbids or folds (C1 controls, U+2028/9, U+FEFF, lone surrogates) escaped,
so both readers see the same text.

Concurrency: readers take no lock. Writes are atomic: the new content goes to
a temporary file in the same directory, is fsynced, then `os.replace`d over the
store, so a reader (in any process) sees the old file or the new one, never a
mix, and a crash at any point leaves the previous file intact (at worst a
stray `.<name>.*.tmp` file). Writers serialise on an advisory `flock` of the
current store file (no lock file is created) and, holding it, reload the file
if another process replaced it since this one read it, so writers through
haiku.rag never lose each other's changes. Limits: readers keep the snapshot
they opened (reopen to see later writes); a program that rewrites the file
without taking the lock (an editor, another tool) can still race a writer, and
then the last writer wins; `flock` is advisory and may be a no-op on network
filesystems, and on Windows only threads are serialised.

Search: vectors live in a numpy matrix (`_vectors.VectorIndex`: exact, HNSW
once it pays off) and BM25 in an in-RAM tantivy index built on the first
keyword search (~2 s at 100k chunks) and updated in place on later writes.

Costs, measured at 100k chunks of 384 dimensions (~450 characters each; a
~310 MB file): open ~1.3 s (10k: ~0.1 s); every write rewrites the whole file
(encoded chunks are cached after a handle's first write, so a rewrite is mostly
I/O), which makes ingest quadratic: 100k chunks from nothing, 640 per write as
`HaikuRAG.add` does, take ~70 s. The driver suits stores a person could ship as
one file; beyond ~100k chunks use lancedb.
"""

from __future__ import annotations

import binascii
import contextlib
import copy
import json
import os
import re
import tempfile
import threading
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import yaml
from pydantic import ConfigDict, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from haiku.rag.documents import Chunk, Document
from haiku.rag.errors import ReadOnlyError, StoreError, StoreNotFoundError
from haiku.rag.store._tantivy import KeywordIndex
from haiku.rag.store._vectors import VectorIndex
from haiku.rag.store.base import (
    Ranked,
    StoreFeatures,
    StoreSettings,
    validate_query_vector,
    validate_write,
)

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: writers serialise per process only
    fcntl = None  # type: ignore[assignment]

DRIVER = "yaml"
FORMAT_VERSION = 1
SUFFIXES = (".yaml", ".yml")
_OTHER_SUFFIXES = {".lancedb": "lancedb", ".duckdb": "duckdb"}
_NOT_FOUND_FIX = "create it with `haiku-rag add` or HaikuRAG(..., create=True)"
_SWITCH = (
    "A store's driver is fixed when it is created; to switch to yaml, create a new .yaml "
    "store and add your documents to it again (then delete the old one)"
)
_HEADER = (
    b"# haiku.rag knowledge base (yaml driver). One document or chunk per line; a chunk's\n"
    b"# vector is base64 of little-endian float32. haiku.rag rewrites this file on each change.\n"
)
_SECTION_END = b"\n  ]"
_SECTIONS = ("documents", "chunks")
_SCALARS = ("haiku_rag", "settings", "graph")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")
_BUFFER = 1 << 20
_DOCUMENT_KEYS = (
    "id",
    "uri",
    "title",
    "content_hash",
    "created_at",
    "updated_at",
    "metadata",
    "content",
)


class _ChunkRow(TypedDict):
    id: str
    document_id: str
    order: int
    start: int
    headings: list[str]
    content: str


class _ChunkItem(_ChunkRow):
    """A chunk as written in the file; in JSON mode pydantic decodes the base64 itself."""

    __pydantic_config__ = ConfigDict(val_json_bytes="base64")  # type: ignore[misc]
    vector: bytes


_CHUNK_ROWS = TypeAdapter(list[_ChunkRow])
_CHUNK_ITEMS = TypeAdapter(list[_ChunkItem])
_DOCUMENTS = TypeAdapter(list[Document])


class _NotCanonical(Exception):
    """The file is valid for us only through the YAML parser (or not at all)."""


# -- encoding ------------------------------------------------------------------


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _dumps(value: Any) -> bytes:
    """JSON that YAML reads back to the same value (a flow node on one line)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    return _YAML_UNSAFE.sub(_escape, text).encode("utf-8")


def _document_item(document: Document) -> bytes:
    data = document.model_dump(mode="json")
    return _dumps({key: data[key] for key in _DOCUMENT_KEYS})


def _chunk_item(row: _ChunkRow, vector: np.ndarray) -> bytes:
    """The chunk as one JSON object, vector last (the long, unreadable part)."""
    head = _dumps(row)[:-1]
    encoded = binascii.b2a_base64(vector.astype("<f4", copy=False).tobytes(), newline=False)
    return head + b', "vector": "' + encoded + b'"}'


def _section(name: bytes, items: Iterable[bytes]) -> Iterator[bytes]:
    """`name: [`, one item per line, then `  ]` on a line of its own (or `name: []`)."""
    first = True
    for item in items:
        yield (name + b": [\n  " if first else b",\n  ") + item
        first = False
    yield name + b": []\n" if first else _SECTION_END + b"\n"


# -- decoding ------------------------------------------------------------------


@dataclass(frozen=True)
class _Parsed:
    """A read and validated file, the same whichever reader produced it."""

    settings: StoreSettings
    documents: list[Document]
    rows: list[_ChunkRow]
    vectors: np.ndarray
    graph: Any


def _json(text: bytes) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise _NotCanonical from None


def _parse_fast(file: Path, data: bytes) -> _Parsed:
    """Read a file in the layout this driver writes; `_NotCanonical` on any deviation.

    Top-level lines are few and parsed one by one; each section is one JSON array
    handed whole to pydantic's Rust JSON validator, which also decodes the vectors.
    """
    top: dict[str, Any] = {}
    spans: dict[str, tuple[int, int]] = {}
    pos, size = 0, len(data)
    while pos < size:
        newline = data.find(b"\n", pos)
        if newline < 0:
            newline = size
        line = data[pos:newline].rstrip(b"\r")
        if line.strip() and not line.startswith(b"#"):
            key, colon, rest = line.partition(b":")
            name = key.decode("utf-8", "replace")
            value = rest.strip()
            if not colon or name in top or name in spans:
                raise _NotCanonical
            if name in _SCALARS:
                top[name] = _json(value)
            elif name in _SECTIONS and value == b"[":
                # Items are one line each (JSON strings have no raw newline), so the
                # section ends at the first line that is just `  ]`. Chunks are written
                # last: search from the end instead of scanning ~300 MB (were they not
                # last, the span would not be one JSON array and the YAML reader takes over).
                if name == "chunks":
                    close = data.rfind(_SECTION_END, newline)
                else:
                    close = data.find(_SECTION_END, newline)
                if close < 0:
                    raise _NotCanonical
                start = pos + line.index(b"[", len(key))
                newline = data.find(b"\n", close + len(_SECTION_END))
                if newline < 0:
                    newline = size
                if data[close + len(_SECTION_END) : newline].strip():
                    raise _NotCanonical
                spans[name] = (start, close + len(_SECTION_END))
            elif name in _SECTIONS and value.startswith(b"["):
                spans[name] = (pos + line.index(b"[", len(key)), pos + len(line.rstrip()))
            else:
                raise _NotCanonical
        pos = newline + 1
    settings = _check_header(file, top)
    dim = settings.embedding_dim
    try:
        docs = (
            _DOCUMENTS.validate_json(data[slice(*spans["documents"])])
            if ("documents" in spans)
            else []
        )
        items = (
            _CHUNK_ITEMS.validate_json(data[slice(*spans["chunks"])]) if ("chunks" in spans) else []
        )
    except ValidationError:
        raise _NotCanonical from None
    vectors = [item.pop("vector") for item in items]  # type: ignore[misc]
    if any(len(vector) != 4 * dim for vector in vectors):
        raise _NotCanonical
    matrix = np.frombuffer(b"".join(vectors), dtype="<f4").reshape(len(vectors), dim)
    return _Parsed(settings, docs, cast(list[_ChunkRow], items), matrix, top.get("graph"))


def _parse_yaml(file: Path, data: bytes) -> _Parsed:
    """Any YAML spelling of the same structure, through the YAML parser (slow, precise)."""
    try:
        top = yaml.load(data, Loader=_LOADER)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise StoreError(
            f"{file} is not a haiku.rag yaml store: it is not valid YAML{where}{_hint(file)}"
        ) from None
    if not isinstance(top, dict) or "haiku_rag" not in top:
        raise StoreError(
            f"{file} is not a haiku.rag yaml store (no `haiku_rag` header){_hint(file)}"
        )
    settings = _check_header(file, top)
    sections: dict[str, list[Any]] = {}
    for name in _SECTIONS:
        items = top.get(name) or []
        if not isinstance(items, list):
            raise _damaged(file, f"`{name}` is not a list")
        sections[name] = items
    try:
        docs = _DOCUMENTS.validate_python(sections["documents"])
    except ValidationError as error:
        raise _damaged(file, _first_error(error, "documents")) from None
    try:
        rows = _CHUNK_ROWS.validate_python(sections["chunks"])
    except ValidationError as error:
        raise _damaged(file, _first_error(error, "chunks")) from None
    dim = settings.embedding_dim
    blobs = []
    for i, item in enumerate(sections["chunks"]):
        try:
            blob = _decode_vector(item.get("vector"))
        except (binascii.Error, ValueError):
            raise _damaged(file, f"chunks item {i}: vector missing or not base64") from None
        if len(blob) != 4 * dim:
            raise _damaged(
                file, f"chunks item {i}: vector has {len(blob) // 4} values, expected {dim}"
            )
        blobs.append(blob)
    matrix = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), dim)
    return _Parsed(settings, docs, rows, matrix, top.get("graph"))


def _hint(file: Path) -> str:
    other = _OTHER_SUFFIXES.get(file.suffix.lower())
    if other is not None:
        return f"; {file.name} looks like a {other} store: open it with driver={other!r}. {_SWITCH}"
    return "; point to a haiku.rag .yaml store, or choose a new path to create one"


def _switch(file: Path, other: str) -> StoreError:
    return StoreError(
        f"{file} belongs to a {other} store, not a {DRIVER} one: open it with "
        f"driver={other!r}. {_SWITCH}"
    )


def _damaged(file: Path, detail: str) -> StoreError:
    return StoreError(
        f"{file} is a damaged haiku.rag yaml store ({detail}); restore it from a copy, "
        "or delete it and add your documents again"
    )


def _first_error(error: ValidationError, section: str) -> str:
    issue = error.errors()[0]
    loc = list(issue["loc"])
    position = f" item {loc.pop(0)}" if loc and isinstance(loc[0], int) else ""
    fields = ".".join(str(part) for part in loc)
    return f"{section}{position}: {fields + ': ' if fields else ''}{issue['msg']}"


def _decode_vector(value: Any) -> bytes:
    """A vector node: base64 text, or bytes when the YAML parser decoded a `!!binary` tag."""
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise binascii.Error("missing")
    return binascii.a2b_base64(value.encode("ascii"), strict_mode=True)


# -- in-memory state -------------------------------------------------------------

Stamp = tuple[int, int, int, int]
"""(device, inode, size, mtime_ns): identifies one version of the store file."""


def _stamp(stat: os.stat_result) -> Stamp:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


@dataclass(frozen=True)
class _State:
    """One version of the store, never mutated: a write builds the next one."""

    settings: StoreSettings
    documents: dict[str, Document]
    chunks: dict[str, _ChunkRow]
    """Chunk id -> row, grouped by document (in `documents` order), then by `order`."""
    matrix: np.ndarray
    """Row i is the vector of the i-th chunk of `chunks`."""
    rows: dict[str, int]
    by_document: dict[str, list[str]]
    graph: dict[str, Any] | None
    stamp: Stamp | None = None


def _assemble(
    settings: StoreSettings,
    documents: dict[str, Document],
    rows_by_id: dict[str, _ChunkRow],
    by_document: dict[str, list[str]],
    vectors: np.ndarray,
    vector_rows: dict[str, int],
    graph: dict[str, Any] | None,
) -> _State:
    """Lay chunks out in canonical order (documents in order, then chunk order)."""
    order = [cid for doc_id in documents for cid in by_document.get(doc_id, ())]
    take = np.fromiter((vector_rows[cid] for cid in order), dtype=np.int64, count=len(order))
    unchanged = take.size == vectors.shape[0] and np.array_equal(take, np.arange(take.size))
    matrix = vectors if unchanged else vectors[take]
    return _State(
        settings=settings,
        documents=documents,
        chunks={cid: rows_by_id[cid] for cid in order},
        matrix=matrix,
        rows={cid: i for i, cid in enumerate(order)},
        by_document={doc_id: by_document.get(doc_id, []) for doc_id in documents},
        graph=graph,
    )


def _load(file: Path, data: bytes, stamp: Stamp) -> _State:
    """Parse and validate a store file; every problem is a StoreError naming the file."""
    if b"haiku_rag" not in data:
        raise StoreError(
            f"{file} is not a haiku.rag yaml store (no `haiku_rag` header){_hint(file)}"
        )
    try:
        parsed = _parse_fast(file, data)
    except _NotCanonical:
        parsed = _parse_yaml(file, data)
    docs: dict[str, Document] = {}
    for document in parsed.documents:
        if document.id in docs:
            raise _damaged(file, f"document {document.id} appears twice")
        docs[document.id] = document
    rows_by_id: dict[str, _ChunkRow] = {}
    grouped: dict[str, list[_ChunkRow]] = {}
    for row in parsed.rows:
        if row["id"] in rows_by_id:
            raise _damaged(file, f"chunk {row['id']} appears twice")
        if row["document_id"] not in docs:
            raise _damaged(
                file, f"chunk {row['id']} belongs to document {row['document_id']}, not listed"
            )
        rows_by_id[row["id"]] = row
        grouped.setdefault(row["document_id"], []).append(row)
    by_document = {
        doc_id: [row["id"] for row in sorted(chunks, key=lambda row: row["order"])]
        for doc_id, chunks in grouped.items()
    }
    if parsed.graph is not None and not isinstance(parsed.graph, dict):
        raise _damaged(file, "`graph` is not a mapping")
    state = _assemble(
        parsed.settings,
        docs,
        rows_by_id,
        by_document,
        parsed.vectors.astype(np.float32, copy=False),
        {row["id"]: i for i, row in enumerate(parsed.rows)},
        parsed.graph,
    )
    return _replace_stamp(state, stamp)


def _replace_stamp(state: _State, stamp: Stamp | None) -> _State:
    return _State(**{**state.__dict__, "stamp": stamp})


def _check_header(file: Path, top: dict[str, Any]) -> StoreSettings:
    header = top.get("haiku_rag")
    if not isinstance(header, dict):
        raise StoreError(
            f"{file} is not a haiku.rag yaml store (no `haiku_rag` header){_hint(file)}"
        )
    settings_raw = top.get("settings")
    recorded = [
        value.get("driver")
        for value in (header, settings_raw)
        if isinstance(value, dict) and value.get("driver") not in (None, DRIVER)
    ]
    if recorded:
        raise _switch(file, str(recorded[0]))
    version = header.get("format", FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise StoreError(
            f"{file} was written in yaml store format {version}, newer than this haiku.rag "
            f"understands ({FORMAT_VERSION}); upgrade haiku.rag"
        )
    try:
        settings = StoreSettings.model_validate(settings_raw)
    except ValidationError as error:
        raise _damaged(file, _first_error(error, "settings")) from None
    if settings.format_version > FORMAT_VERSION:
        raise StoreError(
            f"{file} was written in store format {settings.format_version}, newer than this "
            f"haiku.rag understands ({FORMAT_VERSION}); upgrade haiku.rag"
        )
    return settings


def _read(file: Path) -> tuple[bytes, Stamp]:
    """The file's bytes and the stamp of that very version (the fd pins the inode)."""
    with open(file, "rb") as handle:
        return _read_handle(handle.fileno())


def _read_handle(fd: int) -> tuple[bytes, Stamp]:
    stat = os.fstat(fd)
    with os.fdopen(os.dup(fd), "rb") as handle:
        handle.seek(0)
        data = handle.read()
    return data, _stamp(stat)


def _check_path(file: Path) -> None:
    """Refuse paths that belong to another driver, saying how to use or switch them."""
    if file.is_dir():
        if (file / "settings.lance").is_dir():
            raise _switch(file, "lancedb")
        raise StoreError(
            f"{file} is a directory; the {DRIVER} driver keeps a store in one file: "
            "pass a path ending in .yaml"
        )


def _umask() -> int:
    """The process umask, read without changing it (os.umask would race other threads)."""
    with (
        contextlib.suppress(OSError, ValueError, StopIteration),
        open("/proc/self/status", encoding="ascii") as status,
    ):
        line = next(line for line in status if line.startswith("Umask:"))
        return int(line.split()[1], 8)
    return 0o077  # pragma: no cover - no /proc: err on the private side


def _publish_new(temp: str, file: Path) -> None:
    """Move `temp` to `file` only if `file` does not exist (raises FileExistsError)."""
    try:
        os.link(temp, file)
    except FileExistsError:
        raise
    except OSError:  # no hard links on this filesystem: check, then rename
        if file.exists():
            raise FileExistsError(file) from None
        os.replace(temp, file)
        return
    os.unlink(temp)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# -- the store ------------------------------------------------------------------


class YamlStore:
    """A haiku.rag store in one YAML file; see the module docstring for layout and limits."""

    driver: ClassVar[str] = DRIVER

    def __init__(self, file: Path, state: _State, *, read_only: bool) -> None:
        """Use `create` or `open`; this wires up an already validated state."""
        self._file = file
        self.path = str(file)
        self.read_only = read_only
        # What the driver can do; whether this handle may write is `read_only`.
        self.features = StoreFeatures(writable=True, keyword_search=True, graph=True)
        self._state: _State | None = state
        self._lock = threading.RLock()
        self._keyword: KeywordIndex | None = None
        self._vectors: VectorIndex | None = None
        self._lines: dict[str, bytes] = {}
        """Encoded chunk lines, filled by the first write: later writes of a big store
        re-encode only what changed."""

    # -- lifecycle -------------------------------------------------------------

    @classmethod
    def create(cls, path: str | Path, settings: StoreSettings) -> YamlStore:
        """Write a new, empty store file; an existing file (of any kind) is an error."""
        file = Path(path).expanduser()
        if settings.driver != DRIVER:
            raise StoreError(
                f"Settings name driver {settings.driver!r}, but {file} would be a {DRIVER} "
                f"store; pass settings with driver={DRIVER!r}"
            )
        _check_path(file)
        other = _OTHER_SUFFIXES.get(file.suffix.lower())
        if other is not None:
            raise StoreError(
                f"{file} names a {other} store; give the {DRIVER} driver a path ending in .yaml"
            )
        if file.exists():
            raise StoreError(
                f"A file already exists at {file}; open it, or delete it first to create a "
                "new store there"
            )
        sidecar = file.with_suffix(".duckdb")
        if sidecar.exists():
            raise StoreError(
                f"{sidecar} is beside {file}: that is a duckdb store whose settings file is "
                "missing. Bring the .yaml file back, or choose another path for a yaml store"
            )
        if not file.parent.is_dir():
            raise StoreError(f"Cannot create {file}: the directory {file.parent} does not exist")
        state = _State(
            settings=settings,
            documents={},
            chunks={},
            matrix=np.zeros((0, settings.embedding_dim), dtype=np.float32),
            rows={},
            by_document={},
            graph=None,
        )
        store = cls(file, state, read_only=False)
        with store._lock:
            store._state = _replace_stamp(state, store._commit(state, exclusive=True))
        return store

    @classmethod
    def open(cls, path: str | Path, *, read_only: bool = False) -> YamlStore:
        """Load the file into memory; the vector and keyword indexes are built on demand."""
        file = Path(path).expanduser()
        _check_path(file)
        try:
            data, stamp = _read(file)
        except FileNotFoundError:
            raise StoreNotFoundError(f"No haiku.rag store at {file}; {_NOT_FOUND_FIX}") from None
        except OSError as error:
            raise StoreError(f"Cannot read {file}: {error.strerror or error}") from None
        return cls(file, _load(file, data, stamp), read_only=read_only)

    def close(self) -> None:
        """Drop the in-memory copy; the store is unusable afterwards."""
        with self._lock:
            self._state = None
            self._keyword = None
            self._vectors = None
            self._lines = {}

    def __enter__(self) -> YamlStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "writable"
        return f"YamlStore({self.path!r}, {mode})"

    def _current(self) -> _State:
        state = self._state
        if state is None:
            raise StoreError(f"The store at {self.path} is closed; open it again")
        return state

    @property
    def settings(self) -> StoreSettings:
        return self._current().settings

    # -- documents ---------------------------------------------------------------

    def list_documents(self, limit: int | None = None, offset: int = 0) -> list[Document]:
        """Documents ordered by uri (stable pages, like every driver)."""
        if offset < 0 or (limit is not None and limit < 0):
            raise ValueError("limit and offset must not be negative")
        documents = sorted(self._current().documents.values(), key=lambda d: (d.uri, d.id))
        end = None if limit is None else offset + limit
        return [document.model_copy(deep=True) for document in documents[offset:end]]

    def get_documents(self, document_ids: Sequence[str]) -> list[Document]:
        found = (self.get_document(document_id) for document_id in dict.fromkeys(document_ids))
        return [document for document in found if document is not None]

    def get_document(self, document_id: str) -> Document | None:
        document = self._current().documents.get(document_id)
        return None if document is None else document.model_copy(deep=True)

    def document_hashes(self) -> dict[str, str]:
        return {doc.uri: doc.content_hash for doc in self._current().documents.values()}

    def count_documents(self) -> int:
        return len(self._current().documents)

    def count_chunks(self) -> int:
        return len(self._current().chunks)

    # -- chunks --------------------------------------------------------------------

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[Chunk]:
        chunks = self._current().chunks
        return [Chunk(**chunks[cid]) for cid in chunk_ids if cid in chunks]

    def document_chunks(self, document_id: str) -> list[Chunk]:
        state = self._current()
        return [Chunk(**state.chunks[cid]) for cid in state.by_document.get(document_id, ())]

    # -- writes --------------------------------------------------------------------

    def write(
        self,
        documents: Sequence[Document],
        chunks: Sequence[Chunk],
        vectors: np.ndarray,
    ) -> None:
        """Insert or replace `documents` with exactly `chunks`; one atomic file rewrite."""
        self._check_writable()
        matrix = self._validated(documents, chunks, vectors)
        if not documents:
            return
        replaced = {document.id for document in documents}
        new_rows = {chunk.id: _row(chunk) for chunk in chunks}

        def change(state: _State) -> _State:
            for chunk in chunks:
                existing = state.chunks.get(chunk.id)
                owner = None if existing is None else existing["document_id"]
                if owner is not None and owner not in replaced:
                    raise StoreError(
                        f"Chunk id {chunk.id} already belongs to document {owner}; "
                        "chunk ids must be unique across documents"
                    )
            docs = dict(state.documents)
            for document in documents:
                docs[document.id] = document.model_copy(deep=True)
            by_document = {k: v for k, v in state.by_document.items() if k not in replaced}
            for doc_id in replaced:
                by_document[doc_id] = []
            for chunk in sorted(chunks, key=lambda c: c.order):
                by_document[chunk.document_id].append(chunk.id)
            rows_by_id = {**state.chunks, **new_rows}
            offset = state.matrix.shape[0]
            vector_rows = {**state.rows, **{c.id: offset + i for i, c in enumerate(chunks)}}
            combined = np.concatenate([state.matrix, matrix]) if len(chunks) else state.matrix
            return _assemble(
                state.settings, docs, rows_by_id, by_document, combined, vector_rows, state.graph
            )

        rows = [(chunk.id, chunk.content, chunk.document_id) for chunk in chunks]
        with self._lock:
            for chunk_id in new_rows:  # re-encode what this write brings, vectors included
                self._lines.pop(chunk_id, None)
            self._transact(change, remove=replaced, add=rows)

    def _validated(
        self, documents: Sequence[Document], chunks: Sequence[Chunk], vectors: np.ndarray
    ) -> np.ndarray:
        """Check everything before touching the file, so a bad call changes nothing."""
        matrix = validate_write(
            documents, chunks, vectors, self._current().settings, str(self.path)
        )
        return np.array(matrix, dtype=np.float32, copy=True)

    def delete_documents(self, document_ids: Collection[str]) -> int:
        """Remove documents and their chunks in one atomic rewrite; returns how many."""
        self._check_writable()
        wanted = set(document_ids)
        if not wanted:
            return 0
        removed = 0

        def change(state: _State) -> _State | None:
            nonlocal removed
            gone = wanted & state.documents.keys()
            removed = len(gone)
            if not gone:
                return None
            docs = {k: v for k, v in state.documents.items() if k not in gone}
            return _assemble(
                state.settings,
                docs,
                state.chunks,
                state.by_document,
                state.matrix,
                state.rows,
                state.graph,
            )

        self._transact(change, remove=wanted)
        return removed

    def save_graph(self, data: dict[str, Any]) -> None:
        """Replace the graph payload (any JSON-able mapping) in one atomic rewrite."""
        self._check_writable()
        try:
            payload = json.loads(_dumps(data))
        except (TypeError, ValueError) as error:
            raise StoreError(f"The graph payload is not JSON-serialisable: {error}") from None
        if not isinstance(payload, dict):
            raise StoreError("The graph payload must be a mapping")

        def change(state: _State) -> _State:
            return _State(**{**state.__dict__, "graph": payload, "stamp": None})

        self._transact(change)

    def _check_writable(self) -> None:
        self._current()
        if self.read_only:
            raise ReadOnlyError(
                f"The store at {self.path} is open read-only; open it with read_only=False to write"
            )

    def _transact(
        self,
        change: Any,
        *,
        remove: Collection[str] = (),
        add: Sequence[tuple[str, str, str]] = (),
    ) -> None:
        """Apply `change` to the newest version on disk and commit it; nothing on error.

        Holding the writer lock, reload the file if another process replaced it
        since we read it, so its changes are kept; then write the next version.
        """
        with self._lock, self._file_lock() as fd:
            state = self._current()
            reloaded = False
            if fd is not None:  # pragma: no branch - None only where flock is missing
                stat = os.fstat(fd)
                if _stamp(stat) != state.stamp:
                    data, stamp = _read_handle(fd)
                    state = _load(self._file, data, stamp)
                    reloaded = True
                    # What we derived from our old version is stale: another writer may
                    # have rewritten the same chunk ids (a rebuild) or any document.
                    self._lines = {}
                    self._keyword = None
                    self._adopt(state)
            new_state = change(state)
            if new_state is None:
                return
            stamp = self._commit(new_state)
            self._adopt(_replace_stamp(new_state, stamp))
            if not reloaded and self._keyword is not None and (remove or add):
                self._keyword.update(remove_documents=remove, add=add)

    def _adopt(self, state: _State) -> None:
        self._state = state
        self._vectors = None

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[int | None]:
        """An exclusive flock on the current store file (retried if it is replaced
        while we wait). Yields its fd, or None where flock does not exist."""
        if fcntl is None:  # pragma: no cover - Windows
            yield None
            return
        while True:
            try:
                fd = os.open(self._file, os.O_RDONLY)
            except FileNotFoundError:
                raise StoreError(
                    f"The store file {self._file} was deleted while open; nothing was written"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                current = os.stat(self._file)
                mine = os.fstat(fd)
                if (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
                    break
            except FileNotFoundError:
                os.close(fd)
                raise StoreError(
                    f"The store file {self._file} was deleted while open; nothing was written"
                ) from None
            os.close(fd)  # replaced while we waited: lock the new file instead
        try:
            yield fd
        finally:
            os.close(fd)  # closing the fd releases the lock

    def _commit(self, state: _State, *, exclusive: bool = False) -> Stamp:
        """Write `state` to a temp file beside the store, fsync, then rename over it."""
        directory = self._file.parent
        try:
            fd, temp = tempfile.mkstemp(prefix=f".{self._file.name}.", suffix=".tmp", dir=directory)
        except OSError as error:
            raise StoreError(
                f"Cannot write {self._file}: {error.strerror or error}; nothing was changed"
            ) from None
        try:
            with os.fdopen(fd, "wb", buffering=_BUFFER) as handle:
                for part in self._render(state):
                    handle.write(part)
                handle.flush()
                os.fsync(handle.fileno())
                os.chmod(temp, self._mode())
                stamp = _stamp(os.fstat(handle.fileno()))
            if exclusive:
                _publish_new(temp, self._file)
            else:
                os.replace(temp, self._file)
        except BaseException as error:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            if isinstance(error, FileExistsError):
                raise StoreError(
                    f"A file already exists at {self._file}; open it, or delete it first"
                ) from None
            if isinstance(error, OSError):
                raise StoreError(
                    f"Cannot write {self._file}: {error.strerror or error}; nothing was changed"
                ) from None
            raise
        _fsync_directory(directory)
        return stamp

    def _mode(self) -> int:
        """Keep the store file's permissions; a new file gets 0666 less the umask."""
        try:
            return os.stat(self._file).st_mode & 0o7777
        except FileNotFoundError:
            return 0o666 & ~_umask()

    def _render(self, state: _State) -> Iterable[bytes]:
        """The file's bytes, in pieces (a 100k-chunk store is ~300 MB)."""
        yield _HEADER
        yield b"haiku_rag: " + _dumps({"format": FORMAT_VERSION, "driver": DRIVER}) + b"\n"
        yield b"settings: " + _dumps(state.settings.model_dump(mode="json")) + b"\n"
        yield b"graph: " + _dumps(state.graph) + b"\n"
        yield from _section(b"documents", map(_document_item, state.documents.values()))
        cache = self._lines
        fresh: dict[str, bytes] = {}

        def chunk_items() -> Iterator[bytes]:
            for i, (cid, row) in enumerate(state.chunks.items()):
                item = cache.get(cid)
                if item is None:
                    item = _chunk_item(row, state.matrix[i])
                fresh[cid] = item
                yield item

        yield from _section(b"chunks", chunk_items())
        self._lines = fresh

    # -- search --------------------------------------------------------------------

    def vector_search(
        self, vector: np.ndarray, limit: int, document_ids: Collection[str] | None = None
    ) -> Ranked:
        """Cosine kNN (exact, or HNSW once it pays off); scores are cosine similarity."""
        state = self._current()
        query = validate_query_vector(vector, state.settings, str(self.path))
        if limit <= 0 or (document_ids is not None and not document_ids):
            return []
        return self._vector_index(state).search(query, limit, document_ids)

    def keyword_search(
        self, query: str, limit: int, document_ids: Collection[str] | None = None
    ) -> Ranked:
        """BM25 over chunk text; the query is analysed into plain terms, never parsed."""
        self._current()
        if not query.strip() or limit <= 0 or (document_ids is not None and not document_ids):
            return []
        return self._keyword_index().search(query, limit, document_ids)

    def _vector_index(self, state: _State) -> VectorIndex:
        with self._lock:
            index = self._vectors
            if index is None or self._state is not state:
                index = VectorIndex(
                    list(state.chunks),
                    [row["document_id"] for row in state.chunks.values()],
                    state.matrix,
                )
                if self._state is state:
                    self._vectors = index
            return index

    def _keyword_index(self) -> KeywordIndex:
        with self._lock:
            if self._keyword is None:
                state = self._current()
                self._keyword = KeywordIndex(
                    (cid, row["content"], row["document_id"]) for cid, row in state.chunks.items()
                )
            return self._keyword

    # -- graph -----------------------------------------------------------------------

    def load_graph(self) -> dict[str, Any] | None:
        graph = self._current().graph
        return None if graph is None else copy.deepcopy(graph)


def _row(chunk: Chunk) -> _ChunkRow:
    return _ChunkRow(
        id=chunk.id,
        document_id=chunk.document_id,
        order=chunk.order,
        start=chunk.start,
        headings=list(chunk.headings),
        content=chunk.content,
    )


def delete_store(path: str | Path) -> None:
    """Delete the store file at `path`; refuses a file that is not a haiku.rag yaml store."""
    file = Path(path).expanduser()
    if not file.exists():
        raise StoreNotFoundError(f"No haiku.rag store at {file}; nothing to delete")
    _check_path(file)
    with open(file, "rb") as handle:
        head = handle.read(4096)
    if b"haiku_rag" not in head:
        raise StoreError(f"{file} is not a haiku.rag yaml store; refusing to delete it")
    file.unlink()


__all__ = ["DRIVER", "FORMAT_VERSION", "SUFFIXES", "YamlStore", "delete_store"]
