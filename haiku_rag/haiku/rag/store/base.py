"""The storage protocol every driver implements; the retriever and client see only this.

A driver owns documents, chunks with their vectors, the settings the store was
built with, vector kNN, keyword (BM25) search where it can, and its own locking.
It declares what it can do in `features` so callers can fail clearly.

Invariants every driver keeps:

- Vectors are float32, L2-normalised by the caller; similarity is cosine, and
  `vector_search` returns higher-is-better scores.
- `write` is atomic per call: after an exception the previous content is intact.
- Ranked searches return `(chunk_id, score)` best first, restricted to
  `document_ids` when given.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel

from haiku.rag.documents import Chunk, Document
from haiku.rag.errors import StoreError

Ranked = list[tuple[str, float]]
"""`(chunk_id, score)` pairs, best first."""


@dataclass(frozen=True)
class StoreFeatures:
    """What the driver can do at all; how a store was opened is `Store.read_only`."""

    writable: bool = True
    keyword_search: bool = True
    graph: bool = True


class StoreSettings(BaseModel):
    """What a store was built with; fixed at creation, checked on every open."""

    driver: str
    embedding_model: str
    embedding_dim: int
    chunk_size: int
    chunk_overlap: int
    format_version: int = 1


@runtime_checkable
class Store(Protocol):
    driver: ClassVar[str]
    path: str
    read_only: bool
    features: StoreFeatures

    @classmethod
    def create(cls, path: str, settings: StoreSettings) -> Store:
        """Make a new, empty store at `path`; a store already there is an error."""
        ...

    @classmethod
    def open(cls, path: str, *, read_only: bool = False) -> Store:
        """Open an existing store; raises StoreNotFoundError when there is none."""
        ...

    @property
    def settings(self) -> StoreSettings: ...

    # documents
    def list_documents(self, limit: int | None = None, offset: int = 0) -> list[Document]: ...
    def get_document(self, document_id: str) -> Document | None: ...
    def get_documents(self, document_ids: Sequence[str]) -> list[Document]:
        """The documents that exist among `document_ids`, in one round trip (hydration)."""
        ...

    def document_hashes(self) -> dict[str, str]:
        """uri -> content sha256 of every stored document (drives incremental add)."""
        ...

    def count_documents(self) -> int: ...
    def count_chunks(self) -> int: ...

    # chunks
    def get_chunks(self, chunk_ids: Sequence[str]) -> list[Chunk]:
        """The chunks that exist among `chunk_ids`, in the order asked for."""
        ...

    def document_chunks(self, document_id: str) -> list[Chunk]:
        """All chunks of a document, in order."""
        ...

    # writes
    def write(
        self,
        documents: Sequence[Document],
        chunks: Sequence[Chunk],
        vectors: np.ndarray,
    ) -> None:
        """Insert or replace `documents` with exactly these chunks (row i of `vectors` is
        chunk i). Atomic: on error the previous versions stay readable."""
        ...

    def delete_documents(self, document_ids: Collection[str]) -> int:
        """Delete documents and their chunks; returns how many documents were removed."""
        ...

    # search
    def vector_search(
        self, vector: np.ndarray, limit: int, document_ids: Collection[str] | None = None
    ) -> Ranked: ...

    def keyword_search(
        self, query: str, limit: int, document_ids: Collection[str] | None = None
    ) -> Ranked: ...

    # graph persistence (opaque JSON-able payload owned by retrieval.graph)
    def load_graph(self) -> dict[str, Any] | None: ...
    def save_graph(self, data: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def validate_write(
    documents: Sequence[Document],
    chunks: Sequence[Chunk],
    vectors: np.ndarray,
    settings: StoreSettings,
    path: str,
) -> np.ndarray:
    """Check a `Store.write` call before any driver touches disk, so a bad call changes
    nothing; returns the vectors as a float32 (n_chunks, dim) matrix."""
    doc_ids = [doc.id for doc in documents]
    if len(set(doc_ids)) != len(doc_ids):
        raise StoreError("write() got the same document twice; pass each document once")
    chunk_ids = [chunk.id for chunk in chunks]
    if len(set(chunk_ids)) != len(chunk_ids):
        raise StoreError("write() got the same chunk id twice; chunk ids must be unique")
    known = set(doc_ids)
    strays = sorted({c.document_id for c in chunks if c.document_id not in known})
    if strays:
        raise StoreError(
            f"Chunks refer to documents not in this write ({', '.join(strays[:3])}); "
            "write each document together with its chunks"
        )
    dim = settings.embedding_dim
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.size == 0 and not chunks:
        matrix = matrix.reshape(0, dim)
    if matrix.ndim != 2 or matrix.shape[0] != len(chunks):
        raise StoreError(
            f"write() needs one vector per chunk: got {matrix.shape[0] if matrix.ndim else 0} "
            f"vectors for {len(chunks)} chunks"
        )
    if matrix.shape[1] != dim:
        raise StoreError(
            f"Vectors have {matrix.shape[1]} dimensions but the store at {path} was built "
            f"with {settings.embedding_model} ({dim}); embed with that model, "
            "or rebuild the store"
        )
    if not np.isfinite(matrix).all():
        raise StoreError("write() got vectors with NaN or infinite values; check the embedder")
    return matrix


def validate_query_vector(vector: np.ndarray, settings: StoreSettings, path: str) -> np.ndarray:
    """The query as a flat float32 vector of the store's dimension; a vector from another
    model is an error naming the model to embed queries with."""
    query = np.asarray(vector, dtype=np.float32).reshape(-1)
    dim = settings.embedding_dim
    if query.shape[0] != dim:
        raise StoreError(
            f"Query vector has {query.shape[0]} dimensions but the store at {path} "
            f"holds {dim}-dimensional vectors ({settings.embedding_model}); embed "
            "queries with that model"
        )
    return query
