"""The default driver: an embedded LanceDB directory (`<name>.lancedb`).

Layout: four Lance tables in the directory.

- `documents`: id, uri, title, content, metadata_json, content_hash, created_at, updated_at
- `chunks`: id, document_id, order, content, start, headings_json, vector
- `settings`: one row, the `StoreSettings` JSON the store was created with
- `graph`: at most one row, the JSON payload of `retrieval.graph`

Writes touch two tables and LanceDB commits per table, so atomicity is built
from three pieces (see `write`):

1. chunks are committed first, in one `merge_insert`, then documents, in another;
   the document row carries the content hash, so it is written last;
2. an exception in between restores both tables to the versions seen before the
   write (Lance versions are cheap: restore commits a pointer to old files);
3. a process killed in between leaves a marker file; the next writable open
   deletes chunks whose document row is missing. A replaced document keeps its
   old hash, so the next incremental add sees it as changed and rewrites it.

BM25 uses LanceDB's native inverted index. It is created empty with the store
and never rebuilt on write: LanceDB searches rows the index has not seen yet by
brute force and hides deleted rows at once, so results are always current. When
too many rows are unindexed (which makes queries slower), `write` folds them in
with `Table.optimize()`. Vector search is exact until `optimize()` finds the
table large enough for an HNSW index.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, cast

import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pydantic_core
from lancedb.expr import Expr, col
from lancedb.index import FTS, HnswSq
from lancedb.query import MatchQuery
from lancedb.table import LanceTable
from pydantic import ValidationError

from haiku.rag.documents import Chunk, Document
from haiku.rag.errors import ReadOnlyError, StoreError, StoreNotFoundError
from haiku.rag.store import sniff_driver, wrong_driver_message
from haiku.rag.store.base import (
    Ranked,
    StoreFeatures,
    StoreSettings,
    validate_query_vector,
    validate_write,
)

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: in-process locking only
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

DRIVER = "lancedb"
FORMAT_VERSION = 1

VERSION_RETENTION = timedelta(seconds=60)
"""Table versions older than this are deleted by `optimize()`. Every write is a version;
keeping them all grew a 100k-chunk store to 4.3 GB (37 MB of live data per 20k chunks).
A minute covers any query still reading an older version."""
ANN_THRESHOLD = 50_000
"""Chunks from which `optimize()` builds an HNSW index. Measured on 2 cores with
384-d vectors at 50k rows: exact search ~70 ms/query, HNSW-SQ ~4 ms at 0.98
recall@50, built in ~13 s. Below this, exact search is fast enough and perfect."""

FTS_UNINDEXED_LIMIT = 2_000
"""Unindexed chunks tolerated before `write` folds them into the BM25 index.
Measured: each unindexed 2000-character chunk adds ~0.035 ms to every keyword
query (2000 rows ~ 70 ms), while folding them in costs 0.3-1.8 s at 10k-50k rows."""

_HNSW_EF = 200
_REFINE_FACTOR = 2
"""An ANN index returns distances from its quantised vectors (for cosine, on a
different scale from exact search); refining re-scores candidates exactly, so the
scores stay true cosine similarities whether or not an index exists."""

_IN_BATCH = 1_000
_SETTINGS_KEY = "settings"
_GRAPH_KEY = "graph"
_FTS_INDEX = "content_idx"
_VECTOR_INDEX = "vector_idx"
_LOCK_FILE = ".haiku-rag.lock"
_PENDING_FILE = ".haiku-rag.pending"
_TABLES = ("documents", "chunks", "graph", "settings")
_CHUNK_COLUMNS = ["id", "document_id", "order", "content", "start", "headings_json"]
_NOT_FOUND_FIX = "create it with `haiku-rag add` or HaikuRAG(..., create=True)"

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_DOCUMENTS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("uri", pa.string(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("content", pa.string(), nullable=False),
        pa.field("metadata_json", pa.string(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("created_at", _TIMESTAMP, nullable=False),
        pa.field("updated_at", _TIMESTAMP, nullable=False),
    ]
)
_KV_SCHEMA = pa.schema(
    [pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string(), nullable=False)]
)


def _chunks_schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("document_id", pa.string(), nullable=False),
            pa.field("order", pa.int32(), nullable=False),
            pa.field("content", pa.string(), nullable=False),
            pa.field("start", pa.int64(), nullable=False),
            pa.field("headings_json", pa.string(), nullable=False),
            pa.field("vector", pa.list_(pa.float32(), dim), nullable=False),
        ]
    )


@dataclass(frozen=True)
class OptimizeStats:
    """What `LanceDBStore.optimize` did, for `info` and logs."""

    chunks: int
    vector_index: bool
    vector_index_created: bool
    orphans_removed: int


def _is_store(path: Path) -> bool:
    return (path / "settings.lance").is_dir()


def _isin(column: str, values: Collection[str]) -> Expr:
    """A typed IN filter: values are passed as literals, so no quoting can go wrong."""
    return col(column).isin(list(values))


def _batches(values: Sequence[str], size: int = _IN_BATCH) -> Iterator[Sequence[str]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def _open_tables(db: lancedb.DBConnection) -> dict[str, LanceTable]:
    # A local connection always opens LanceTables; the abstract signature says Table.
    return {name: cast(LanceTable, db.open_table(name)) for name in _TABLES}


def _rows(table: LanceTable, where: Expr | None, columns: list[str]) -> list[dict[str, Any]]:
    query = table.search().select(columns).limit(None)
    if where is not None:
        query = query.where(where)
    return query.to_list()


def _ranked(rows: list[dict[str, Any]], scores: list[float]) -> Ranked:
    """Best first; ties broken by id so results do not depend on file layout."""
    pairs = [(row["id"], score) for row, score in zip(rows, scores, strict=True)]
    return sorted(pairs, key=lambda pair: (-pair[1], pair[0]))


def _chunk_from_row(row: dict[str, Any]) -> Chunk:
    return Chunk(
        id=row["id"],
        document_id=row["document_id"],
        order=row["order"],
        content=row["content"],
        start=row["start"],
        headings=json.loads(row["headings_json"]),
    )


def _document_from_row(row: dict[str, Any]) -> Document:
    return Document(
        id=row["id"],
        uri=row["uri"],
        title=row["title"],
        content=row["content"],
        metadata=json.loads(row["metadata_json"]),
        content_hash=row["content_hash"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


class LanceDBStore:
    """A haiku.rag store in a LanceDB directory; see the module docstring for the layout."""

    driver: ClassVar[str] = DRIVER

    def __init__(
        self,
        path: Path,
        db: lancedb.DBConnection,
        settings: StoreSettings,
        *,
        read_only: bool,
    ) -> None:
        """Use `create` or `open`; this only wires up an already validated store."""
        self._root = path
        self.path = str(path)
        self.read_only = read_only
        self.features = StoreFeatures(writable=True, keyword_search=True, graph=True)
        self.fts_unindexed_limit = FTS_UNINDEXED_LIMIT
        self._db: lancedb.DBConnection | None = db
        self._settings = settings
        self._tables = _open_tables(db)
        self._thread_lock = threading.RLock()
        self._lock_depth = 0

    # -- lifecycle ---------------------------------------------------------

    @classmethod
    def create(cls, path: str | Path, settings: StoreSettings) -> LanceDBStore:
        """Create an empty store at `path` (a new or empty directory)."""
        root = Path(path).expanduser()
        if settings.driver != DRIVER:
            raise StoreError(
                f"Settings name driver {settings.driver!r}, but {root} is a {DRIVER} store; "
                f"pass settings with driver={DRIVER!r}"
            )
        if root.exists() and not root.is_dir():
            raise StoreError(f"{root} exists and is not a directory; choose another path")
        if _is_store(root):
            raise StoreError(
                f"A haiku.rag store already exists at {root}; open it, or delete it first"
            )
        if root.is_dir():
            ours = {f"{name}.lance" for name in _TABLES} | {_LOCK_FILE, _PENDING_FILE}
            foreign = sorted(p.name for p in root.iterdir() if p.name not in ours)
            if foreign:
                raise StoreError(
                    f"{root} is not empty ({', '.join(foreign[:3])}...); "
                    "choose a new path for the store"
                )
            # Leftovers of an interrupted create (settings are written last).
            for name in _TABLES:
                shutil.rmtree(root / f"{name}.lance", ignore_errors=True)
        db = lancedb.connect(root, read_consistency_interval=timedelta(0))
        chunks = db.create_table("chunks", schema=_chunks_schema(settings.embedding_dim))
        chunks.create_index("content", config=FTS(), name=_FTS_INDEX)
        db.create_table("documents", schema=_DOCUMENTS_SCHEMA)
        db.create_table("graph", schema=_KV_SCHEMA)
        row = {"key": _SETTINGS_KEY, "value": settings.model_dump_json()}
        db.create_table("settings", data=pa.Table.from_pylist([row], schema=_KV_SCHEMA))
        return cls(root, db, settings, read_only=False)

    @classmethod
    def open(cls, path: str | Path, *, read_only: bool = False) -> LanceDBStore:
        """Open an existing store; a writable open also repairs an interrupted write."""
        root = Path(path).expanduser()
        if not root.exists():
            raise StoreNotFoundError(f"No haiku.rag store at {root}; {_NOT_FOUND_FIX}")
        if not _is_store(root):
            owner = sniff_driver(root)
            if owner is not None and owner != "lancedb":
                raise StoreError(wrong_driver_message(root, owner, "lancedb"))
            raise StoreError(
                f"{root} exists but is not a haiku.rag LanceDB store (no settings table); "
                "point to the store directory, or choose a new path to create one"
            )
        db = lancedb.connect(root, read_consistency_interval=timedelta(0))
        try:
            tables = _open_tables(db)
            rows = _rows(tables["settings"], col("key") == _SETTINGS_KEY, ["value"])
            settings = StoreSettings.model_validate_json(rows[0]["value"])
        except (ValueError, FileNotFoundError, IndexError, ValidationError) as error:
            raise StoreError(
                f"{root} is a damaged haiku.rag store ({error}); "
                "delete it and rebuild it with `haiku-rag add`"
            ) from None
        if settings.driver != DRIVER:
            raise StoreError(
                f"{root} records driver {settings.driver!r}, not {DRIVER!r}; "
                "open it with that driver"
            )
        if settings.format_version > FORMAT_VERSION:
            raise StoreError(
                f"{root} was written in store format {settings.format_version}, newer than this "
                f"haiku.rag understands ({FORMAT_VERSION}); upgrade haiku.rag"
            )
        store = cls(root, db, settings, read_only=read_only)
        if not read_only and (root / _PENDING_FILE).exists():
            store._repair()
        return store

    def _repair(self) -> None:
        """Prune what a killed write left behind. The marker is checked again under the
        lock: it may belong to a write that another process is finishing right now."""
        marker = self._root / _PENDING_FILE
        with self._write_lock():
            if not marker.exists():
                return
            removed = self._prune_orphans()
            marker.unlink()
        logger.warning("Repaired an interrupted write in %s (%d orphan chunks)", self.path, removed)

    def close(self) -> None:
        """Release the table and connection handles; the store is unusable afterwards."""
        # The sync lancedb API has no close(); its async handles do, and hold the files.
        for table in self._tables.values():
            with contextlib.suppress(Exception):
                table._table.close()
        if self._db is not None:
            with contextlib.suppress(Exception):
                self._db._conn.close()  # type: ignore[attr-defined]
        self._tables = {}
        self._db = None

    def __enter__(self) -> LanceDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "writable"
        return f"LanceDBStore({self.path!r}, {mode})"

    @property
    def settings(self) -> StoreSettings:
        return self._settings

    def _table(self, name: str) -> LanceTable:
        try:
            return self._tables[name]
        except KeyError:
            raise StoreError(f"The store at {self.path} is closed; open it again") from None

    def _check_writable(self) -> None:
        self._table("documents")
        if self.read_only:
            raise ReadOnlyError(
                f"The store at {self.path} is open read-only; open it with read_only=False to write"
            )

    @contextlib.contextmanager
    def _write_lock(self) -> Iterator[None]:
        """One writer at a time, across threads and processes (readers never wait).

        Re-entrant within a thread: a second flock on a new file handle would wait
        for the first one forever.
        """
        with self._thread_lock:
            if self._lock_depth:
                self._lock_depth += 1
                try:
                    yield
                finally:
                    self._lock_depth -= 1
                return
            with open(self._root / _LOCK_FILE, "a") as handle:
                if fcntl is not None:  # pragma: no branch
                    fcntl.flock(handle, fcntl.LOCK_EX)
                self._lock_depth = 1
                try:
                    yield
                finally:
                    self._lock_depth = 0
                    if fcntl is not None:  # pragma: no branch
                        fcntl.flock(handle, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """Roll documents and chunks back together when anything in the block raises.

        A marker file covers what rollback cannot: the process dying mid-block.
        """
        with self._write_lock():
            tables = [self._table("chunks"), self._table("documents")]
            versions = [table.version for table in tables]
            marker = self._root / _PENDING_FILE
            marker.touch()
            try:
                yield
            except BaseException:
                for table, version in zip(tables, versions, strict=True):
                    if table.version != version:
                        try:
                            table.restore(version)
                        except Exception:  # pragma: no cover - keep the marker for repair
                            logger.exception("Could not roll back %s", table.name)
                            raise
                marker.unlink(missing_ok=True)
                raise
            marker.unlink(missing_ok=True)

    # -- documents ---------------------------------------------------------

    def list_documents(self, limit: int | None = None, offset: int = 0) -> list[Document]:
        """Documents ordered by uri (stable pages), then their content for the page only."""
        if offset < 0 or (limit is not None and limit < 0):
            raise ValueError("limit and offset must not be negative")
        keys = _rows(self._table("documents"), None, ["id", "uri"])
        keys.sort(key=lambda row: (row["uri"], row["id"]))
        end = None if limit is None else offset + limit
        page = [row["id"] for row in keys[offset:end]]
        by_id = {doc.id: doc for doc in self._documents_by_id(page)}
        return [by_id[doc_id] for doc_id in page if doc_id in by_id]

    def _documents_by_id(self, ids: Sequence[str]) -> list[Document]:
        table = self._table("documents")
        rows: list[dict[str, Any]] = []
        for batch in _batches(ids):
            rows.extend(_rows(table, _isin("id", batch), _DOCUMENTS_SCHEMA.names))
        return [_document_from_row(row) for row in rows]

    def get_documents(self, document_ids: Sequence[str]) -> list[Document]:
        return self._documents_by_id(list(dict.fromkeys(document_ids)))

    def get_document(self, document_id: str) -> Document | None:
        rows = _rows(self._table("documents"), col("id") == document_id, _DOCUMENTS_SCHEMA.names)
        return _document_from_row(rows[0]) if rows else None

    def document_hashes(self) -> dict[str, str]:
        rows = _rows(self._table("documents"), None, ["uri", "content_hash"])
        return {row["uri"]: row["content_hash"] for row in rows}

    def count_documents(self) -> int:
        return self._table("documents").count_rows()

    def count_chunks(self) -> int:
        return self._table("chunks").count_rows()

    # -- chunks ------------------------------------------------------------

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[Chunk]:
        table = self._table("chunks")
        wanted = list(dict.fromkeys(chunk_ids))
        found: dict[str, Chunk] = {}
        for batch in _batches(wanted):
            for row in _rows(table, _isin("id", batch), _CHUNK_COLUMNS):
                found[row["id"]] = _chunk_from_row(row)
        return [found[chunk_id] for chunk_id in chunk_ids if chunk_id in found]

    def document_chunks(self, document_id: str) -> list[Chunk]:
        rows = _rows(self._table("chunks"), col("document_id") == document_id, _CHUNK_COLUMNS)
        return sorted((_chunk_from_row(row) for row in rows), key=lambda chunk: chunk.order)

    # -- writes ------------------------------------------------------------

    def write(
        self,
        documents: Sequence[Document],
        chunks: Sequence[Chunk],
        vectors: np.ndarray,
    ) -> None:
        """Insert or replace `documents` with exactly these chunks, atomically.

        Chunks are merged first (stale chunks of these documents deleted in the same
        commit), documents last, so a stored content hash always describes chunks that
        are in place. On an exception both tables are restored to their prior versions.
        """
        self._check_writable()
        chunk_data, doc_data, doc_ids = self._validated(documents, chunks, vectors)
        if not doc_ids:
            return
        with self._transaction():
            self._merge_chunks(chunk_data, doc_ids)
            self._merge_documents(doc_data)
        self._fold_keyword_index()

    def _validated(
        self, documents: Sequence[Document], chunks: Sequence[Chunk], vectors: np.ndarray
    ) -> tuple[pa.Table, pa.Table, list[str]]:
        """Check everything before touching disk, so a bad call changes nothing."""
        matrix = validate_write(documents, chunks, vectors, self._settings, str(self.path))
        dim = matrix.shape[1]
        doc_ids = [doc.id for doc in documents]
        chunk_ids = [chunk.id for chunk in chunks]
        chunk_data = pa.table(
            {
                "id": chunk_ids,
                "document_id": [c.document_id for c in chunks],
                "order": [c.order for c in chunks],
                "content": [c.content for c in chunks],
                "start": [c.start for c in chunks],
                "headings_json": [json.dumps(c.headings, ensure_ascii=False) for c in chunks],
                "vector": pa.FixedSizeListArray.from_arrays(
                    pa.array(matrix.reshape(-1), type=pa.float32()), dim
                ),
            },
            schema=_chunks_schema(dim),
        )
        doc_data = pa.Table.from_pylist(
            [
                {
                    "id": doc.id,
                    "uri": doc.uri,
                    "title": doc.title,
                    "content": doc.content,
                    # pydantic's JSON rules, so datetimes or paths in metadata serialise
                    # the same way `Document.model_dump_json` would.
                    "metadata_json": pydantic_core.to_json(doc.metadata).decode(),
                    "content_hash": doc.content_hash,
                    "created_at": doc.created_at,
                    "updated_at": doc.updated_at,
                }
                for doc in documents
            ],
            schema=_DOCUMENTS_SCHEMA,
        )
        return chunk_data, doc_data, doc_ids

    def _merge_chunks(self, data: pa.Table, doc_ids: Sequence[str]) -> None:
        """One commit: upsert these chunks, delete other chunks of the same documents."""
        (
            self._table("chunks")
            .merge_insert("id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .when_not_matched_by_source_delete(_isin("document_id", doc_ids))
            .execute(data)
        )

    def _merge_documents(self, data: pa.Table) -> None:
        self._table("documents").merge_insert(
            "id"
        ).when_matched_update_all().when_not_matched_insert_all().execute(data)

    def _fold_keyword_index(self) -> None:
        """Fold unindexed chunks into the BM25 index once they slow queries down."""
        chunks = self._table("chunks")
        stats = chunks.index_stats(_FTS_INDEX)
        if stats is None or stats.num_unindexed_rows <= self.fts_unindexed_limit:
            return
        try:
            with self._write_lock():
                chunks.optimize(cleanup_older_than=VERSION_RETENTION)
        except Exception as error:  # the write itself is committed; search stays correct
            logger.warning("Could not update the keyword index of %s: %s", self.path, error)

    def delete_documents(self, document_ids: Collection[str]) -> int:
        """Documents first, then their chunks: an interruption leaves orphan chunks (pruned
        on the next writable open), never a document hash without its chunks."""
        self._check_writable()
        ids = list(dict.fromkeys(document_ids))
        if not ids:
            return 0
        documents, chunks = self._table("documents"), self._table("chunks")
        with self._transaction():
            removed = sum(documents.count_rows(_isin("id", b).to_sql()) for b in _batches(ids))
            for batch in _batches(ids):
                documents.delete(_isin("id", batch))
                chunks.delete(_isin("document_id", batch))
        return removed

    def _prune_orphans(self) -> int:
        """Delete chunks whose document row is missing (left by an interrupted write)."""
        chunks = self._table("chunks")
        doc_ids = set(_rows_column(self._table("documents"), "id"))
        chunk_doc_ids = pc.unique(
            chunks.search().select(["document_id"]).limit(None).to_arrow()["document_id"]
        ).to_pylist()
        orphans = [doc_id for doc_id in chunk_doc_ids if doc_id not in doc_ids]
        if not orphans:
            return 0
        before = chunks.count_rows()
        for batch in _batches(orphans):
            chunks.delete(_isin("document_id", batch))
        return before - chunks.count_rows()

    # -- search ------------------------------------------------------------

    def vector_search(
        self, vector: np.ndarray, limit: int, document_ids: Collection[str] | None = None
    ) -> Ranked:
        """Cosine kNN, exact below the ANN threshold; scores are cosine similarity."""
        query = validate_query_vector(vector, self._settings, str(self.path))
        table = self._table("chunks")
        if limit <= 0 or (document_ids is not None and not document_ids):
            return []
        search = (
            table.search(query, query_type="vector", vector_column_name="vector")
            .distance_type("cosine")
            .ef(max(_HNSW_EF, 2 * limit))
            .refine_factor(_REFINE_FACTOR)
            .limit(limit)
            .select(["id", "_distance"])
        )
        if document_ids is not None:
            search = search.where(_isin("document_id", document_ids), prefilter=True)
        rows = search.to_list()
        return _ranked(rows, [1.0 - float(row["_distance"]) for row in rows])

    def keyword_search(
        self, query: str, limit: int, document_ids: Collection[str] | None = None
    ) -> Ranked:
        """BM25 over chunk text. The query is matched as plain terms (a MatchQuery, never
        parsed), so quotes, colons, `AND` or `-` in user input are just words."""
        table = self._table("chunks")
        text = query.strip()
        if not text or limit <= 0 or (document_ids is not None and not document_ids):
            return []
        # A pydantic dataclass (mypy misreads its defaults), which lancedb's search()
        # overloads forget to list although the implementation takes it.
        match = MatchQuery(text, "content")  # type: ignore[call-arg]
        search = (
            table.search(match, query_type="fts")  # type: ignore[call-overload]
            .limit(limit)
            .select(["id", "_score"])
        )
        if document_ids is not None:
            search = search.where(_isin("document_id", document_ids), prefilter=True)
        rows = search.to_list()
        return _ranked(rows, [float(row["_score"]) for row in rows])

    # -- graph -------------------------------------------------------------

    def load_graph(self) -> dict[str, Any] | None:
        rows = _rows(self._table("graph"), col("key") == _GRAPH_KEY, ["value"])
        return json.loads(rows[0]["value"]) if rows else None

    def save_graph(self, data: dict[str, Any]) -> None:
        """Replace the graph payload in one commit."""
        self._check_writable()
        row = {"key": _GRAPH_KEY, "value": json.dumps(data, ensure_ascii=False)}
        with self._write_lock():
            self._table("graph").merge_insert(
                "key"
            ).when_matched_update_all().when_not_matched_insert_all().execute(
                pa.Table.from_pylist([row], schema=_KV_SCHEMA)
            )

    # -- maintenance ---------------------------------------------------------

    def has_vector_index(self) -> bool:
        return self._table("chunks").index_stats(_VECTOR_INDEX) is not None

    def optimize(self, *, ann_threshold: int = ANN_THRESHOLD) -> OptimizeStats:
        """Call after large adds: prunes orphans, builds the ANN index once the table
        reaches `ann_threshold` chunks, compacts files and folds new rows into indexes."""
        self._check_writable()
        chunks, documents = self._table("chunks"), self._table("documents")
        with self._write_lock():
            orphans = self._prune_orphans()
            count = chunks.count_rows()
            created = False
            if count >= ann_threshold and not self.has_vector_index():
                # One IVF partition (the default at this scale) = one HNSW graph; SQ keeps
                # it compact. Searches refine with exact vectors (see _REFINE_FACTOR).
                chunks.create_index(
                    "vector", config=HnswSq(distance_type="cosine"), name=_VECTOR_INDEX
                )
                created = True
            chunks.optimize(cleanup_older_than=VERSION_RETENTION)
            documents.optimize(cleanup_older_than=VERSION_RETENTION)
        return OptimizeStats(
            chunks=count,
            vector_index=self.has_vector_index(),
            vector_index_created=created,
            orphans_removed=orphans,
        )


def _rows_column(table: LanceTable, column: str) -> list[Any]:
    return table.search().select([column]).limit(None).to_arrow()[column].to_pylist()


def delete_store(path: str | Path) -> None:
    """Delete the store at `path`; refuses a directory that is not a haiku.rag store."""
    root = Path(path).expanduser()
    if not root.exists():
        raise StoreNotFoundError(f"No haiku.rag store at {root}; nothing to delete")
    if not _is_store(root):
        raise StoreError(f"{root} is not a haiku.rag LanceDB store; refusing to delete it")
    shutil.rmtree(root)


__all__ = ["ANN_THRESHOLD", "LanceDBStore", "OptimizeStats", "delete_store"]
