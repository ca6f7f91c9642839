"""The DuckDB driver: `<name>.yaml` (settings, document list) + `<name>.duckdb` (the data).

Layout
------
`kb.duckdb` is the store path; `kb.yaml` beside it is its sidecar (a path ending in
`.yaml` names the same store). The sidecar is small, readable and diffable: the
settings and one line per document (id, uri, title, metadata, content hash,
timestamps), no vectors, no text. Everything bulky lives in the database:

- `chunks`: id, document_id, order, content, start, headings, `terms` (the text as the
  keyword analyser sees it), `vec FLOAT[dim]`
- `documents`: id, content_hash, content (document text is as big as all its chunks
  together, so it stays out of the yaml; the hash is repeated to detect drift)
- `meta`: settings, format, the graph payload, and `fts_dirty`

Writes and crashes
------------------
A write is one DuckDB transaction (delete the documents' old chunks, insert the new
ones) followed by an atomic rewrite of the sidecar (temp file + `os.replace`). The
new sidecar is written to its temp file *before* the commit, so nothing but the
rename can fail after it. A process killed between commit and rename leaves the
database one step ahead of the sidecar: `document_hashes` then reports the
affected documents as changed (their hashes disagree), so the next add rewrites
them, and the next write deletes rows of documents the sidecar does not list.
Nothing is rewritten but the written documents' rows.

When the sidecar lists documents but the database is missing, empty or holds none of
them, the store warns once (`DuckDBStoreWarning`, naming the file and the fix: bring
it back, or add the sources again) and searches return nothing; `document_hashes`
reports those documents as changed, so the next add re-embeds them into a new
database. Document text lives only in the database, so `rebuild` cannot restore it.

Readers or one writer
---------------------
DuckDB allows many read-only connections *or* one read-write connection per file
(across processes). Reads use a read-only connection that is kept while it is in
use and released after `idle_release` seconds without a call, so an idle reader
does not block writers forever; writes open a read-write connection for that
write only. A process that finds the other kind of lock held waits up to
`lock_timeout` seconds, then raises `StoreBusyError` ("being written by another
process, try again").

Indexes (numbers measured on the project's 2-core machine, 384-d vectors)
-----------------------------------------------------------------------
- BM25 (`fts`): chunk text is analysed in Python exactly like the other drivers'
  keyword indexes (`_tantivy.analyzer`: LanceDB's FTS defaults) and stored in `terms`;
  fts indexes that column with its own analysis turned off, and a query goes through
  the same analyser, so BM25 ranks like LanceDB (fts's scoring is the same BM25,
  k1 = 1.2, b = 0.75). The fts index does not update incrementally and a rebuild
  costs ~0.35 ms per chunk (3.5 s at 10k chunks of ~2000 characters, 6.5 s at 20k),
  too slow for every write batch of an ingest. Writes set `fts_dirty` in their
  transaction; the index is rebuilt once, when a writable store that wrote is closed
  (the end of an ingest), or on a writable store's first keyword search after a
  write. A read-only store finding it dirty searches the last built index (deleted
  chunks never show; new ones are not found by keyword yet) and warns.
- Vectors (`vss` HNSW, cosine, experimental persistence): exact search costs ~4 ms
  per 1k chunks (42 ms p50 at 10k, ~430 ms at 100k); HNSW answers in ~15 ms at 20k
  with recall@10 0.98 at `ef_search` 256 (vss's default 64 gives 0.81 there, 0.54 at
  100k, on clustered random vectors). Maintaining the index costs ~1.4 ms per
  inserted vector, and in vss 1.5.5 every checkpoint that changed the index writes a
  new copy of it without freeing the old one (+16 MB per checkpoint at 10k chunks,
  +25 MB at 20k; `DROP INDEX` frees them). So the index is built only once a store
  holds `HNSW_MIN_CHUNKS` chunks (at the end of that writing session: ~15 s at 20k);
  below that, search is exact. With an index, writes stay in the WAL until the
  writing session ends (read-only connections replay it, ~0.3 s per 1k rows) and
  `optimize(reclaim=True)` rebuilds the index to give the leaked space back.
  Filtered queries (`document_ids`) never use the index (vss does not combine it with
  a WHERE clause), so they are exact top-k within the filter (~4 ms).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import duckdb
import numpy as np
import pyarrow as pa
import yaml
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from haiku.rag.documents import Chunk, Document
from haiku.rag.errors import ReadOnlyError, StoreError, StoreNotFoundError
from haiku.rag.store import _duckdb_ext, _tantivy
from haiku.rag.store.base import (
    Ranked,
    StoreFeatures,
    StoreSettings,
    validate_query_vector,
    validate_write,
)

logger = logging.getLogger(__name__)

DRIVER = "duckdb"
FORMAT_VERSION = 1
SIDECAR_SUFFIXES = (".yaml", ".yml")

HNSW_MIN_CHUNKS = 20_000
"""Chunks from which the HNSW index is built (at the end of the writing session that
crosses it). Below, exact search costs under ~90 ms and is always right."""
HNSW_EF_SEARCH = 256
"""Candidates the HNSW search keeps: recall@10 0.98 at 20k chunks vs 0.81 at vss's 64."""
LOCK_TIMEOUT = 3.0
"""Seconds to wait for another process's lock before raising `StoreBusyError`."""
READ_IDLE_SECONDS = 1.0
"""A read connection unused this long is closed, so writers in other processes can go."""
WAL_CHECKPOINT = "64MB"
"""With an HNSW index, DuckDB checkpoints on its own only past this much WAL."""
RECLAIM_WARN_AFTER = 8
"""Index-changing checkpoints (each leaks a copy of the index) before suggesting reclaim."""

_INDEX = "chunks_hnsw"
_FTS_SCHEMA = "fts_main_chunks"
_FTS_PRAGMA = (
    "PRAGMA create_fts_index('chunks', 'id', 'terms', stemmer = 'none', stopwords = 'none', "
    "ignore = '\\s+', strip_accents = 0, lower = 0, overwrite = 1)"
)
"""BM25 over the `terms` column: text already analysed like every other driver's keyword
index (`_tantivy.analyzer`, LanceDB's FTS defaults), so fts only splits on spaces."""
_NOT_FOUND_FIX = "create it with `haiku-rag add` or HaikuRAG(..., create=True)"
_SWITCH = (
    "A store's driver is fixed when it is created; to switch to duckdb, create a new "
    ".duckdb store and add your documents to it again (then delete the old store)"
)
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")
"""Characters YAML forbids or folds inside quoted scalars; written as JSON escapes."""


class StoreBusyError(StoreError):
    """Another process holds the lock this call needs; trying again later works."""


class DuckDBStoreWarning(UserWarning):
    """The store works but is degraded: its database is missing, or an index is stale."""


@dataclass(frozen=True)
class DuckDBStatus:
    """What the database holds, for `info` and tests."""

    documents: int
    chunks: int
    vector_index: bool
    keyword_index_stale: bool
    database_bytes: int
    wal_bytes: int


class _Entry(BaseModel):
    """A document as the sidecar lists it: everything but its content."""

    id: str
    uri: str
    title: str | None = None
    content_hash: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, document: Document) -> _Entry:
        return cls(**document.model_dump(exclude={"content"}))

    def document(self, stored: tuple[str, str] | None) -> Document:
        """With the database's `(content, content_hash)`: the hash always describes the
        content returned, and a document whose content is missing gets hash "", so
        anything that re-writes it (`rebuild`) leaves it marked as changed."""
        content, content_hash = stored or ("", "")
        return Document(**{**self.model_dump(), "content_hash": content_hash}, content=content)


_ENTRIES = TypeAdapter(list[_Entry])


@dataclass(frozen=True)
class _Sidecar:
    settings: StoreSettings
    entries: dict[str, _Entry]
    stamp: tuple[int, int, int] | None


@dataclass
class _Reader:
    """A read-only connection and what it saw when it opened (stable while it is open:
    no writer can get in while a read lock is held)."""

    con: duckdb.DuckDBPyConnection
    has_index: bool
    fts_dirty: bool
    fts_ready: bool
    hashes: dict[str, str]


@dataclass
class _Writer:
    con: duckdb.DuckDBPyConnection
    has_index: bool
    fts_dirty: bool


# -- paths and the sidecar -------------------------------------------------------------


def store_paths(path: str | Path) -> tuple[Path, Path]:
    """`(database, sidecar)` for a store named by either file."""
    given = Path(path).expanduser()
    if given.suffix.lower() in SIDECAR_SUFFIXES:
        return given.with_suffix(".duckdb"), given
    return given, given.with_suffix(".yaml")


def _stamp(file: Path) -> tuple[int, int, int] | None:
    try:
        stat = file.stat()
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


def _has_data(db: Path) -> bool:
    """A database file that is there and not empty (a 0-byte file counts as missing)."""
    return db.is_file() and db.stat().st_size > 0


def _json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return _YAML_UNSAFE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def _render(db: Path, settings: StoreSettings, entries: Collection[_Entry]) -> bytes:
    """One JSON flow mapping per line: valid YAML for any parser, and fast to read back."""
    lines = [
        "# haiku.rag knowledge base (duckdb driver): settings and the document list.",
        f"# Chunks, vectors, document text and the graph live in {db.name} beside this file;",
        "# keep the two files together.",
        f"haiku_rag: {_json({'format': FORMAT_VERSION, 'driver': DRIVER, 'database': db.name})}",
        f"settings: {_json(settings.model_dump(mode='json'))}",
    ]
    if entries:
        lines.append("documents:")
        lines.extend(f"- {_json(entry.model_dump(mode='json'))}" for entry in entries)
    else:
        lines.append("documents: []")
    return ("\n".join(lines) + "\n").encode("utf-8")


def _parse_lines(text: str) -> dict[str, Any] | None:
    """The layout `_render` writes, read with `json` line by line; None on any deviation."""
    top: dict[str, Any] = {}
    documents: list[Any] | None = None
    try:
        for line in text.split("\n"):
            if not line or line.startswith("#"):
                continue
            if line.startswith("- ") and documents is not None:
                documents.append(json.loads(line[2:]))
            elif line == "documents:":
                documents = top["documents"] = []
            elif line.startswith(("haiku_rag: ", "settings: ", "documents: ")):
                key, _, value = line.partition(": ")
                top[key] = json.loads(value)
                documents = None
            else:
                return None
    except ValueError:
        return None
    return top


def _switch_error(file: Path, other: object) -> StoreError:
    return StoreError(
        f"{file} belongs to a {other} store, not a {DRIVER} one. A duckdb store "
        f"{file.with_suffix('.duckdb').name} keeps its settings in {file.name}: pick another "
        f"name for the duckdb store, or open the {other} store (driver={other!r}, "
        f"--driver {other}). {_SWITCH}"
    )


def _read_sidecar(file: Path) -> _Sidecar:
    stamp = _stamp(file)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise StoreError(f"Cannot read {file} ({error}); check the file") from None
    top = _parse_lines(text)
    if top is None:
        try:
            top = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError as error:
            raise _damaged(file, f"not valid YAML: {error}") from None
    if not isinstance(top, dict) or not isinstance(top.get("haiku_rag"), dict):
        raise StoreError(
            f"{file} is not a haiku.rag store's settings file (no `haiku_rag` header); "
            "point to a .duckdb store, or choose a new name to create one"
        )
    settings_raw = top.get("settings")
    for value in (top["haiku_rag"], settings_raw):
        if isinstance(value, dict) and value.get("driver") not in (None, DRIVER):
            raise _switch_error(file, value["driver"])
    version = top["haiku_rag"].get("format", FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise StoreError(
            f"{file} was written in duckdb store format {version}, newer than this haiku.rag "
            f"understands ({FORMAT_VERSION}); upgrade haiku.rag"
        )
    try:
        settings = StoreSettings.model_validate(settings_raw)
        entries = _ENTRIES.validate_python(top.get("documents") or [])
    except ValidationError as error:
        raise _damaged(file, str(error).splitlines()[0]) from None
    return _Sidecar(settings, {entry.id: entry for entry in entries}, stamp)


def _damaged(file: Path, detail: str) -> StoreError:
    return StoreError(
        f"{file} is a damaged haiku.rag settings file ({detail}); restore it from a copy, "
        "or delete the store and add your documents again"
    )


def _write_temp(file: Path, data: bytes) -> Path:
    """Write `data` beside `file` and fsync it; publishing is a separate, atomic rename."""
    fd, name = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".tmp")
    temp = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if file.exists():
            shutil.copymode(file, temp)
        else:
            os.chmod(temp, 0o644)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def _publish(temp: Path, file: Path) -> None:
    os.replace(temp, file)
    with contextlib.suppress(OSError):
        fd = os.open(file.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _check_paths(db: Path, file: Path) -> None:
    if db.is_dir():
        if (db / "settings.lance").is_dir():
            raise StoreError(
                f"{db} is a lancedb store (a directory), not a {DRIVER} one: open it with "
                f"driver='lancedb'. {_SWITCH}"
            )
        raise StoreError(f"{db} is a directory; the duckdb driver needs a path ending in .duckdb")
    if file.is_dir():
        raise StoreError(f"{file} is a directory; move it away or choose another store name")


# -- the database ------------------------------------------------------------------------


def _busy_message(db: Path, error: duckdb.Error, *, writing: bool) -> str | None:
    """Our message for a lock conflict, or None when `error` is something else."""
    text = str(error)
    if isinstance(error, duckdb.ConnectionException) and "different configuration" in text:
        return f"{db} is open in this process by another store object; close it first, or try again"
    if "Could not set lock" not in text:
        return None
    found = re.search(r"PID (\d+)", text)
    who = f"another process (PID {found.group(1)})" if found else "another process"
    if writing and "read-only mode" in text:
        return (
            f"{db} is being read by {who}: a DuckDB store takes one writer and no readers "
            "while it writes; try again when that process is done (or close it)"
        )
    return f"{db} is being written by {who}; try again when that write finishes"


def _user_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main'"
    ).fetchall()
    return {name for (name,) in rows}


def _meta(con: duckdb.DuckDBPyConnection, db: Path) -> dict[str, str] | None:
    """The meta table, or None for a database with no tables yet (ours to initialise)."""
    tables = _user_tables(con)
    if not tables:
        return None
    if not {"meta", "documents", "chunks"} <= tables:
        raise StoreError(
            f"{db} is a DuckDB database but not a haiku.rag store ({', '.join(sorted(tables))}); "
            "move it away, or choose another store name"
        )
    rows = con.execute("SELECT key, value FROM meta WHERE key <> 'graph'").fetchall()
    return dict(rows)


def _exists(con: duckdb.DuckDBPyConnection, sql: str, value: str) -> bool:
    row = con.execute(sql, [value]).fetchone()
    return bool(row and row[0])


def _has_index(con: duckdb.DuckDBPyConnection) -> bool:
    sql = "SELECT count(*) FROM duckdb_indexes() WHERE index_name = ?"
    return _exists(con, sql, _INDEX)


def _has_fts(con: duckdb.DuckDBPyConnection) -> bool:
    return _exists(con, "SELECT count(*) FROM duckdb_schemas() WHERE schema_name = ?", _FTS_SCHEMA)


def _create_schema(con: duckdb.DuckDBPyConnection, settings: StoreSettings) -> None:
    con.execute("BEGIN")
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
    con.execute(
        "CREATE TABLE documents "
        "(id VARCHAR NOT NULL, content_hash VARCHAR NOT NULL, content VARCHAR NOT NULL)"
    )
    con.execute(
        'CREATE TABLE chunks (id VARCHAR NOT NULL, document_id VARCHAR NOT NULL, "order" '
        "INTEGER NOT NULL, content VARCHAR NOT NULL, start BIGINT NOT NULL, "
        "headings VARCHAR[] NOT NULL, terms VARCHAR NOT NULL, "
        f"vec FLOAT[{settings.embedding_dim}] NOT NULL)"
    )
    con.executemany(
        "INSERT INTO meta VALUES (?, ?)",
        [
            ("settings", settings.model_dump_json()),
            ("format", str(FORMAT_VERSION)),
            ("fts_dirty", "0"),
        ],
    )
    con.execute(_FTS_PRAGMA)
    con.execute("COMMIT")


def _set_meta(con: duckdb.DuckDBPyConnection, key: str, value: str) -> None:
    con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])


def _changed(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    """Run a DELETE/INSERT and return how many rows it changed."""
    row = con.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _vector_literal(vector: np.ndarray) -> str:
    """`[x, ...]`, cast to FLOAT[dim] in SQL. Passing a Python list costs ~40 ms per query
    (element-wise conversion); this text form ~1 ms, and `repr` round-trips float32 exactly."""
    return "[" + ",".join(map(repr, vector.tolist())) + "]"


def _chunk(row: tuple[Any, ...]) -> Chunk:
    chunk_id, document_id, order, content, start, headings = row
    return Chunk(
        id=chunk_id,
        document_id=document_id,
        order=order,
        content=content,
        start=start,
        headings=list(headings),
    )


_CHUNK_COLUMNS = 'id, document_id, "order", content, start, headings'


def _ranked(rows: list[tuple[str, float]]) -> Ranked:
    """Best first; ties broken by id so results do not depend on storage order."""
    return sorted(((cid, float(score)) for cid, score in rows), key=lambda p: (-p[1], p[0]))


# -- the store ---------------------------------------------------------------------------


class DuckDBStore:
    """A haiku.rag store in `<name>.duckdb` + `<name>.yaml`; see the module docstring."""

    driver: ClassVar[str] = DRIVER

    def __init__(
        self,
        db: Path,
        file: Path,
        sidecar: _Sidecar,
        *,
        read_only: bool,
        lock_timeout: float = LOCK_TIMEOUT,
    ) -> None:
        """Use `create` or `open`; this only wires up an already validated store."""
        self.path = str(db)
        self.sidecar_path = str(file)
        self.read_only = read_only
        # What the driver can do; whether this handle may write is `read_only`.
        self.features = StoreFeatures(writable=True, keyword_search=True, graph=True)
        self.lock_timeout = lock_timeout
        self.idle_release: float | None = READ_IDLE_SECONDS
        self.hnsw_min_chunks = HNSW_MIN_CHUNKS
        self.hnsw_ef_search = HNSW_EF_SEARCH
        self._db = db
        self._file = file
        self._sidecar = sidecar
        self._lock = threading.RLock()
        self._reader: _Reader | None = None
        self._timer: threading.Timer | None = None
        self._last_used = 0.0
        self._wrote = False
        self._closed = False
        self._warned: set[str] = set()
        self._analyzer = _tantivy.analyzer()

    # -- lifecycle -------------------------------------------------------------------

    @classmethod
    def create(
        cls, path: str | Path, settings: StoreSettings, *, lock_timeout: float = LOCK_TIMEOUT
    ) -> DuckDBStore:
        """Create the database (schema, empty keyword index), then the sidecar, last: the
        sidecar is what makes the store exist."""
        db, file = store_paths(path)
        if settings.driver != DRIVER:
            raise StoreError(
                f"Settings name driver {settings.driver!r}, but {db} is a {DRIVER} store; "
                f"pass settings with driver={DRIVER!r}"
            )
        _check_paths(db, file)
        if file.exists():
            raise StoreError(
                f"{file} already exists (a haiku.rag store, or another file with the "
                "sidecar's name); open the store, or delete it first, or choose another name"
            )
        if _has_data(db) and not _empty_leftover(db):
            raise StoreError(
                f"{db} already exists and holds data; open it, delete it, or choose another "
                "path for the store"
            )
        for leftover in (db, db.with_name(db.name + ".wal")):
            leftover.unlink(missing_ok=True)
        db.parent.mkdir(parents=True, exist_ok=True)
        con = _duckdb_ext.connect(db, read_only=False)
        try:
            _create_schema(con, settings)
        finally:
            con.close()
        _publish(_write_temp(file, _render(db, settings, [])), file)
        sidecar = _Sidecar(settings, {}, _stamp(file))
        return cls(db, file, sidecar, read_only=False, lock_timeout=lock_timeout)

    @classmethod
    def open(
        cls, path: str | Path, *, read_only: bool = False, lock_timeout: float = LOCK_TIMEOUT
    ) -> DuckDBStore:
        """Open an existing store and check its database (waiting out a write in progress
        for up to `lock_timeout` seconds)."""
        db, file = store_paths(path)
        _check_paths(db, file)
        if not file.exists():
            if _has_data(db):
                raise StoreError(
                    f"{file} is missing: it holds the settings and document list of {db}. "
                    f"Restore it beside {db.name}, or delete {db.name} and add your documents "
                    "again"
                )
            raise StoreNotFoundError(f"No haiku.rag store at {db}; {_NOT_FOUND_FIX}")
        store = cls(db, file, _read_sidecar(file), read_only=read_only, lock_timeout=lock_timeout)
        try:
            with store._reading():
                pass
        except BaseException:
            store._abandon()
            raise
        return store

    @property
    def settings(self) -> StoreSettings:
        return self._sidecar.settings

    @property
    def _wal(self) -> Path:
        return self._db.with_name(self._db.name + ".wal")

    def close(self) -> None:
        """Finish a writing session (rebuild the keyword index, build the vector index once
        the store is big enough, checkpoint), then release every handle."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._wrote and not self.read_only:
                    try:
                        self._finish_session()
                    except StoreError as error:
                        logger.warning("Could not finish writing %s: %s", self.path, error)
                elif not self.read_only and self._wal.exists():
                    # A WAL left behind (a killed writer) is folded in by the next writable
                    # store to close, so readers stop replaying it; if someone is writing
                    # right now, their own close will do it.
                    self.lock_timeout = 0
                    with contextlib.suppress(StoreError):
                        self._finish_session()
            finally:
                self._abandon()

    def _abandon(self) -> None:
        """Release every handle, finishing nothing."""
        with self._lock:
            self._release_reader()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._closed = True

    def optimize(self, *, reclaim: bool = False) -> DuckDBStatus:
        """Rebuild a stale keyword index, build the vector index if the store reached
        `hnsw_min_chunks`, and with `reclaim` rebuild the vector index to free the space
        earlier checkpoints leaked (slow: ~2.5 ms per chunk)."""
        self._check_writable()
        with self._writing() as writer:
            self._maintain(writer, reclaim=reclaim)
        self._wrote = False
        return self.status()

    def status(self) -> DuckDBStatus:
        with self._reading() as reader:
            chunks = 0
            if reader is not None:
                chunks = self._count(reader.con)
            wal = self._wal
            return DuckDBStatus(
                documents=len(self._sidecar.entries),
                chunks=chunks,
                vector_index=reader is not None and reader.has_index,
                keyword_index_stale=reader is not None and not reader.fts_ready,
                database_bytes=self._db.stat().st_size if self._db.exists() else 0,
                wal_bytes=wal.stat().st_size if wal.exists() else 0,
            )

    # -- connections -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"The store at {self.path} is closed; open it again")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise ReadOnlyError(
                f"The store at {self.path} is open read-only; open it without read_only "
                "to change it"
            )

    def _connect(self, *, read_only: bool) -> duckdb.DuckDBPyConnection:
        """Connect, waiting up to `lock_timeout` for another process's lock to go."""
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.02
        while True:
            try:
                return _duckdb_ext.connect(self._db, read_only=read_only)
            except (duckdb.IOException, duckdb.ConnectionException) as error:
                busy = _busy_message(self._db, error, writing=not read_only)
                if busy is None:
                    raise StoreError(
                        f"Cannot open {self._db} ({error}); restore the right file, or delete "
                        "the store and add your documents again"
                    ) from None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StoreBusyError(busy) from None
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.25)

    def _check_meta(self, meta: dict[str, str]) -> None:
        """The database must belong to this sidecar (same model and dimension)."""
        try:
            recorded = StoreSettings.model_validate_json(meta.get("settings", ""))
        except ValidationError:
            raise StoreError(
                f"{self._db} has no valid settings; restore the right file, or delete it and "
                "add your documents again"
            ) from None
        mine = self.settings
        if (recorded.embedding_model, recorded.embedding_dim) != (
            mine.embedding_model,
            mine.embedding_dim,
        ):
            raise StoreError(
                f"{self._db} was built with {recorded.embedding_model} "
                f"({recorded.embedding_dim}-d) but {self._file.name} records "
                f"{mine.embedding_model} ({mine.embedding_dim}-d): they belong to different "
                f"stores. Bring back the matching {self._db.name}, or delete it and add your "
                "documents again"
            )

    def _refresh_sidecar(self) -> None:
        """Reload the sidecar if another process replaced it (called under a db lock, when
        no writer can be between its commit and its sidecar rename)."""
        stamp = _stamp(self._file)
        if stamp is None:
            raise StoreError(
                f"{self._file} disappeared while the store was open (was the store deleted?); "
                "open it again"
            )
        if stamp != self._sidecar.stamp:
            self._sidecar = _read_sidecar(self._file)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[_Reader | None]:
        """A read connection (None when the database is missing), kept for the next call."""
        with self._lock:
            self._check_open()
            reader = self._reader or self._open_reader()
            try:
                yield reader
            finally:
                if reader is not None:
                    self._touch()

    def _open_reader(self) -> _Reader | None:
        if not _has_data(self._db):
            self._refresh_sidecar()
            self._warn_missing_database()
            return None
        con = self._connect(read_only=True)
        try:
            meta = _meta(con, self._db)
            if meta is None:
                con.close()
                self._refresh_sidecar()
                self._warn_missing_database()
                return None
            self._check_meta(meta)
            hashes = dict(con.execute("SELECT id, content_hash FROM documents").fetchall())
            fts = _has_fts(con)
            reader = _Reader(
                con=con,
                has_index=_has_index(con),
                fts_dirty=meta.get("fts_dirty") == "1",
                fts_ready=fts and meta.get("fts_dirty") != "1",
                hashes=hashes,
            )
            self._refresh_sidecar()
        except BaseException:
            con.close()
            raise
        self._reader = reader
        if self._sidecar.entries and not hashes:
            self._warn_missing_database()
        return reader

    def _warn_missing_database(self) -> None:
        count = len(self._sidecar.entries)
        if not count or "database" in self._warned:
            return
        self._warned.add("database")
        warnings.warn(
            f"{self._file} lists {count} documents but their database {self._db} is missing "
            f"or empty, so searches return nothing. Bring {self._db.name} back beside "
            f"{self._file.name}, or rebuild it by adding your sources again "
            "(`haiku-rag add ...`)",
            DuckDBStoreWarning,
            stacklevel=4,
        )

    def _touch(self) -> None:
        self._last_used = time.monotonic()
        if self.idle_release is not None and self._timer is None:
            self._schedule(self.idle_release)

    def _schedule(self, delay: float) -> None:
        self._timer = threading.Timer(delay, self._on_idle)
        self._timer.daemon = True
        self._timer.start()

    def _on_idle(self) -> None:
        """Timer thread: close the read connection once it has been idle long enough."""
        with self._lock:
            self._timer = None
            if self._reader is None or self.idle_release is None:
                return
            remaining = self._last_used + self.idle_release - time.monotonic()
            if remaining > 0:
                self._schedule(remaining)
                return
            self._release_reader()

    def _release_reader(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            reader.con.close()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[_Writer]:
        """A read-write connection for one write; the database lock is held throughout,
        sidecar rename included, so writers never interleave."""
        with self._lock:
            self._check_writable()
            self._release_reader()
            if self._db.is_file() and not _has_data(self._db):
                self._db.unlink()
            con = self._connect(read_only=False)
            try:
                meta = _meta(con, self._db)
                if meta is None:
                    _create_schema(con, self.settings)
                    meta = {"fts_dirty": "0"}
                else:
                    self._check_meta(meta)
                has_index = _has_index(con)
                if has_index:
                    # Each index-changing checkpoint leaks a copy of the index (vss 1.5.5):
                    # keep the writes in the WAL until the session ends.
                    con.execute("PRAGMA disable_checkpoint_on_shutdown")
                    con.execute(f"SET checkpoint_threshold = '{WAL_CHECKPOINT}'")
                self._refresh_sidecar()
                yield _Writer(con, has_index, meta.get("fts_dirty") == "1")
            finally:
                con.close()

    def _commit(
        self,
        con: duckdb.DuckDBPyConnection,
        entries: dict[str, _Entry],
        work: Callable[[duckdb.DuckDBPyConnection], None],
    ) -> None:
        """Run `work` in one transaction, then publish the sidecar for `entries`.

        The sidecar is rendered and fsynced before COMMIT, so only the rename can fail
        after it; on any error before, the transaction rolls back and nothing changed.
        """
        temp = _write_temp(self._file, _render(self._db, self.settings, entries.values()))
        try:
            con.execute("BEGIN")
            try:
                work(con)
                _set_meta(con, "fts_dirty", "1")
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    con.execute("ROLLBACK")
                raise
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        self._wrote = True
        try:
            _publish(temp, self._file)
        except OSError as error:
            temp.unlink(missing_ok=True)
            raise StoreError(
                f"{self._db} was updated but {self._file} could not be ({error}); fix the "
                "problem and run the same add again, which repairs the store"
            ) from None
        self._sidecar = _Sidecar(self.settings, entries, _stamp(self._file))

    def _finish_session(self) -> None:
        with self._writing() as writer:
            self._maintain(writer, reclaim=False)
        self._wrote = False

    def _maintain(self, writer: _Writer, *, reclaim: bool) -> None:
        con = writer.con
        if writer.fts_dirty or not _has_fts(con):
            self._rebuild_fts(con)
        count = self._count(con)
        if not writer.has_index and count and count >= self.hnsw_min_chunks:
            logger.info("Building the HNSW index of %s (%d chunks)", self.path, count)
            self._create_index(con)
        elif writer.has_index and reclaim:
            con.execute(f"DROP INDEX {_INDEX}")
            con.execute("CHECKPOINT")  # frees the index blocks, leaked copies included
            self._create_index(con)
        elif writer.has_index and self._wrote:
            row = con.execute("SELECT value FROM meta WHERE key = 'index_copies'").fetchone()
            copies = int(row[0]) + 1 if row else 1
            _set_meta(con, "index_copies", str(copies))
            if copies >= RECLAIM_WARN_AFTER:
                logger.warning(
                    "%s holds about %d stale copies of its vector index (a DuckDB vss "
                    "limitation); run optimize(reclaim=True) to give the space back",
                    self.path,
                    copies,
                )
        con.execute("CHECKPOINT")

    def _create_index(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute("SET hnsw_enable_experimental_persistence = true")
        con.execute(f"CREATE INDEX {_INDEX} ON chunks USING HNSW (vec) WITH (metric = 'cosine')")
        _set_meta(con, "index_copies", "0")

    def _rebuild_fts(self, con: duckdb.DuckDBPyConnection) -> None:
        """Rebuild the BM25 index and clear the dirty flag in one transaction."""
        started = time.perf_counter()
        con.execute("BEGIN")
        try:
            con.execute(_FTS_PRAGMA)
            _set_meta(con, "fts_dirty", "0")
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
        logger.info(
            "Rebuilt the keyword index of %s in %.2fs", self.path, time.perf_counter() - started
        )

    def _terms(self, text: str) -> str:
        """Text as the keyword index sees it: analysed tokens joined by spaces."""
        with self._lock:
            return " ".join(self._analyzer.analyze(text))

    @staticmethod
    def _count(con: duckdb.DuckDBPyConnection) -> int:
        row = con.execute("SELECT count(*) FROM chunks").fetchone()
        return int(row[0]) if row else 0

    # -- documents -------------------------------------------------------------------

    def list_documents(self, limit: int | None = None, offset: int = 0) -> list[Document]:
        """Documents ordered by uri (stable pages); content is read for the page only."""
        if offset < 0 or (limit is not None and limit < 0):
            raise ValueError("limit and offset must not be negative")
        with self._reading() as reader:
            entries = sorted(self._sidecar.entries.values(), key=lambda e: (e.uri, e.id))
            end = None if limit is None else offset + limit
            page = entries[offset:end]
            contents = self._contents(reader, [entry.id for entry in page])
            return [entry.document(contents.get(entry.id)) for entry in page]

    def _contents(self, reader: _Reader | None, ids: list[str]) -> dict[str, tuple[str, str]]:
        if reader is None or not ids:
            return {}
        rows = reader.con.execute(
            "SELECT id, content, content_hash FROM documents "
            "WHERE id IN (SELECT unnest(?::VARCHAR[]))",
            [ids],
        ).fetchall()
        return {doc_id: (content, content_hash) for doc_id, content, content_hash in rows}

    def get_documents(self, document_ids: Sequence[str]) -> list[Document]:
        with self._reading() as reader:
            wanted = [i for i in dict.fromkeys(document_ids) if i in self._sidecar.entries]
            contents = self._contents(reader, wanted)
            return [self._sidecar.entries[i].document(contents.get(i)) for i in wanted]

    def get_document(self, document_id: str) -> Document | None:
        with self._reading() as reader:
            entry = self._sidecar.entries.get(document_id)
            if entry is None:
                return None
            return entry.document(self._contents(reader, [document_id]).get(document_id))

    def document_hashes(self) -> dict[str, str]:
        """uri -> hash; a document whose database row disagrees with the sidecar (an
        interrupted write, a missing database) maps to "" so the next add rewrites it."""
        with self._reading() as reader:
            stored = reader.hashes if reader is not None else {}
            return {
                entry.uri: entry.content_hash if stored.get(entry.id) == entry.content_hash else ""
                for entry in self._sidecar.entries.values()
            }

    def count_documents(self) -> int:
        with self._reading():
            return len(self._sidecar.entries)

    def count_chunks(self) -> int:
        with self._reading() as reader:
            return 0 if reader is None else self._count(reader.con)

    # -- chunks ----------------------------------------------------------------------

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[Chunk]:
        wanted = list(dict.fromkeys(chunk_ids))
        with self._reading() as reader:
            if reader is None or not wanted:
                return []
            rows = reader.con.execute(
                f"SELECT {_CHUNK_COLUMNS} FROM chunks WHERE id IN (SELECT unnest(?::VARCHAR[]))",
                [wanted],
            ).fetchall()
        found = {row[0]: _chunk(row) for row in rows}
        return [found[chunk_id] for chunk_id in chunk_ids if chunk_id in found]

    def document_chunks(self, document_id: str) -> list[Chunk]:
        with self._reading() as reader:
            if reader is None:
                return []
            rows = reader.con.execute(
                f'SELECT {_CHUNK_COLUMNS} FROM chunks WHERE document_id = ? ORDER BY "order", id',
                [document_id],
            ).fetchall()
        return [_chunk(row) for row in rows]

    # -- writes ----------------------------------------------------------------------

    def write(
        self,
        documents: Sequence[Document],
        chunks: Sequence[Chunk],
        vectors: np.ndarray,
    ) -> None:
        """Replace `documents` with exactly these chunks: one transaction deletes their old
        rows (and rows of documents the sidecar no longer lists) and inserts the new ones;
        then the sidecar is renamed into place. Other documents' rows are not touched."""
        self._check_writable()
        chunk_data, doc_data = self._validated(documents, chunks, vectors)
        if not documents:
            return
        with self._writing() as writer:
            entries = dict(self._sidecar.entries)
            entries.update((doc.id, _Entry.of(doc)) for doc in documents)
            keep = pa.table({"id": pa.array(list(entries), type=pa.string())})

            def work(con: duckdb.DuckDBPyConnection) -> None:
                con.register("haiku_keep", keep)
                con.register("haiku_chunks", chunk_data)
                con.register("haiku_docs", doc_data)
                try:
                    deleted = _changed(
                        con,
                        "DELETE FROM chunks WHERE document_id NOT IN (SELECT id FROM haiku_keep) "
                        "OR document_id IN (SELECT id FROM haiku_docs)",
                    )
                    con.execute(
                        "DELETE FROM documents WHERE id NOT IN (SELECT id FROM haiku_keep) "
                        "OR id IN (SELECT id FROM haiku_docs)"
                    )
                    inserted = _changed(
                        con,
                        f"INSERT INTO chunks SELECT {_CHUNK_COLUMNS}, terms, vec FROM haiku_chunks",
                    )
                    con.execute(
                        "INSERT INTO documents SELECT id, content_hash, content FROM haiku_docs"
                    )
                    logger.debug(
                        "write %s: %d chunk rows deleted, %d inserted", self.path, deleted, inserted
                    )
                finally:
                    for name in ("haiku_keep", "haiku_chunks", "haiku_docs"):
                        con.unregister(name)

            self._commit(writer.con, entries, work)

    def _validated(
        self, documents: Sequence[Document], chunks: Sequence[Chunk], vectors: np.ndarray
    ) -> tuple[pa.Table, pa.Table]:
        """Check everything before touching disk, so a bad call changes nothing."""
        matrix = validate_write(documents, chunks, vectors, self.settings, str(self.path))
        dim = matrix.shape[1]
        doc_ids = [doc.id for doc in documents]
        chunk_ids = [chunk.id for chunk in chunks]
        chunk_data = pa.table(
            {
                "id": pa.array(chunk_ids, type=pa.string()),
                "document_id": pa.array([c.document_id for c in chunks], type=pa.string()),
                "order": pa.array([c.order for c in chunks], type=pa.int32()),
                "content": pa.array([c.content for c in chunks], type=pa.string()),
                "start": pa.array([c.start for c in chunks], type=pa.int64()),
                "headings": pa.array([c.headings for c in chunks], type=pa.list_(pa.string())),
                "terms": pa.array([self._terms(c.content) for c in chunks], type=pa.string()),
                "vec": pa.FixedSizeListArray.from_arrays(
                    pa.array(np.ascontiguousarray(matrix).reshape(-1), type=pa.float32()), dim
                ),
            }
        )
        doc_data = pa.table(
            {
                "id": pa.array(doc_ids, type=pa.string()),
                "content_hash": pa.array([d.content_hash for d in documents], type=pa.string()),
                "content": pa.array([d.content for d in documents], type=pa.string()),
            }
        )
        return chunk_data, doc_data

    def delete_documents(self, document_ids: Collection[str]) -> int:
        """Delete rows in one transaction, then drop the documents from the sidecar."""
        self._check_writable()
        ids = list(dict.fromkeys(document_ids))
        if not ids:
            return 0
        with self._writing() as writer:
            removed = [doc_id for doc_id in ids if doc_id in self._sidecar.entries]
            if not removed:
                return 0
            entries = {k: v for k, v in self._sidecar.entries.items() if k not in set(removed)}

            def work(con: duckdb.DuckDBPyConnection) -> None:
                for table, column in (("chunks", "document_id"), ("documents", "id")):
                    con.execute(
                        f"DELETE FROM {table} WHERE {column} IN (SELECT unnest(?::VARCHAR[]))",
                        [removed],
                    )

            self._commit(writer.con, entries, work)
        return len(removed)

    # -- search ----------------------------------------------------------------------

    def vector_search(
        self, vector: np.ndarray, limit: int, document_ids: Collection[str] | None = None
    ) -> Ranked:
        """Cosine similarity, best first. Unfiltered queries use the HNSW index when the
        store has one; filtered ones scan the filtered rows, so they are exact."""
        query = validate_query_vector(vector, self.settings, str(self.path))
        if limit <= 0 or (document_ids is not None and not document_ids):
            return []
        with self._reading() as reader:
            if reader is None:
                return []
            if document_ids is None and reader.has_index:
                reader.con.execute(f"SET hnsw_ef_search = {max(self.hnsw_ef_search, limit)}")
            sql, params = self._vector_query(reader, query, limit, document_ids)
            rows = reader.con.execute(sql, params).fetchall()
        return _ranked([(chunk_id, 1.0 - d) for chunk_id, d in rows])

    def _vector_query(
        self,
        reader: _Reader,
        query: np.ndarray,
        limit: int,
        document_ids: Collection[str] | None,
    ) -> tuple[str, list[Any]]:
        """The SQL of a vector search. `ORDER BY distance LIMIT k` with nothing else is the
        shape vss answers from the HNSW index; the exact forms add `id` as a tie-break, and
        a WHERE clause makes DuckDB scan (so filtered results are exact)."""
        distance = f"array_cosine_distance(vec, ?::FLOAT[{self.settings.embedding_dim}])"
        select = f"SELECT id, {distance} AS d FROM chunks"
        params: list[Any] = [_vector_literal(query)]
        if document_ids is not None:
            select += " WHERE document_id IN (SELECT unnest(?::VARCHAR[]))"
            params.append(list(document_ids))
        elif reader.has_index:
            return f"{select} ORDER BY d LIMIT {int(limit)}", params
        return f"{select} ORDER BY d, id LIMIT {int(limit)}", params

    def keyword_search(
        self, query: str, limit: int, document_ids: Collection[str] | None = None
    ) -> Ranked:
        """BM25 over chunk text. The query goes through the same analyser as the text and
        is never parsed, so quotes, brackets or operators in it are just characters."""
        text = self._terms(query)
        if not text or limit <= 0 or (document_ids is not None and not document_ids):
            return []
        params: list[Any]
        with self._lock:
            self._refresh_keyword_index()
            with self._reading() as reader:
                if reader is None:
                    return []
                if not reader.fts_ready:
                    self._warn_stale_keywords()
                if not _has_fts(reader.con):
                    return []
                where, params = "", [text]
                if document_ids is not None:
                    where = "WHERE document_id IN (SELECT unnest(?::VARCHAR[]))"
                    params = [text, list(document_ids)]
                rows = reader.con.execute(
                    f"SELECT id, score FROM (SELECT id, {_FTS_SCHEMA}.match_bm25(id, ?) AS score "
                    f"FROM chunks {where}) WHERE score IS NOT NULL "
                    f"ORDER BY score DESC, id LIMIT {int(limit)}",
                    params,
                ).fetchall()
        return _ranked(rows)

    def _refresh_keyword_index(self) -> None:
        """A writable store rebuilds a stale index before searching it (once per write)."""
        if self.read_only:
            return
        with self._reading() as reader:
            stale = reader is not None and not reader.fts_ready
        if not stale:
            return
        try:
            with self._writing() as writer:
                self._rebuild_fts(writer.con)
        except StoreBusyError as error:
            logger.warning("Keyword index of %s not rebuilt: %s", self.path, error)

    def _warn_stale_keywords(self) -> None:
        if "keywords" in self._warned:
            return
        self._warned.add("keywords")
        warnings.warn(
            f"The keyword index of {self.path} is older than its last write (the writer has "
            "not finished, or stopped early): keyword search misses the newest chunks. "
            "Opening the store writable once (e.g. `haiku-rag add`) rebuilds it",
            DuckDBStoreWarning,
            stacklevel=4,
        )

    # -- graph -----------------------------------------------------------------------

    def load_graph(self) -> dict[str, Any] | None:
        with self._reading() as reader:
            if reader is None:
                return None
            row = reader.con.execute("SELECT value FROM meta WHERE key = 'graph'").fetchone()
        return json.loads(row[0]) if row else None

    def save_graph(self, data: dict[str, Any]) -> None:
        """Replace the graph payload in one statement."""
        self._check_writable()
        payload = json.dumps(data, ensure_ascii=False)
        with self._writing() as writer:
            _set_meta(writer.con, "graph", payload)


def _empty_leftover(db: Path) -> bool:
    """A database left by an interrupted `create`: ours, no documents, no sidecar."""
    try:
        con = _duckdb_ext.connect(db, read_only=True)
    except duckdb.Error:
        return False
    try:
        tables = _user_tables(con)
        if not {"meta", "documents", "chunks"} <= tables:
            return False
        row = con.execute("SELECT count(*) FROM documents").fetchone()
        return row is not None and row[0] == 0
    finally:
        con.close()


def delete_store(path: str | Path) -> None:
    """Delete the store: the sidecar, the database and its WAL. Refuses a store another
    process is using, and files that are not a duckdb store."""
    db, file = store_paths(path)
    _check_paths(db, file)
    if not file.exists() and not db.exists():
        raise StoreNotFoundError(f"No haiku.rag store at {db}; nothing to delete")
    if file.exists():
        _read_sidecar(file)  # refuses another driver's file
    if _has_data(db):
        try:
            con = _duckdb_ext.connect(db, read_only=False)
        except (duckdb.IOException, duckdb.ConnectionException) as error:
            busy = _busy_message(db, error, writing=True)
            raise (
                StoreBusyError(busy) if busy else StoreError(f"Cannot open {db}: {error}")
            ) from None
        try:
            if not file.exists() and not {"meta", "documents", "chunks"} <= _user_tables(con):
                raise StoreError(f"{db} is not a haiku.rag store; refusing to delete it")
            con.execute("PRAGMA disable_checkpoint_on_shutdown")
        finally:
            con.close()
    for stray in file.parent.glob(f".{file.name}.*.tmp"):
        stray.unlink(missing_ok=True)
    for target in (file, db, db.with_name(db.name + ".wal")):
        target.unlink(missing_ok=True)


__all__ = [
    "HNSW_MIN_CHUNKS",
    "DuckDBStatus",
    "DuckDBStore",
    "DuckDBStoreWarning",
    "StoreBusyError",
    "delete_store",
    "store_paths",
]
