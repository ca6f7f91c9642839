"""The data that flows through haiku.rag: documents, chunks, search results and citations.

Ids are derived from content so they are stable across runs: a document id comes
from its uri, a chunk id from its document, position and text.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def document_id_for(uri: str) -> str:
    """A document keeps its id for as long as it keeps its uri (re-adds replace in place)."""
    return sha256_hex(uri)[:16]


def chunk_id_for(document_id: str, order: int, content: str) -> str:
    """Changing a chunk's text changes its id, so a stale citation never points at new text."""
    return sha256_hex(f"{document_id}\x00{order}\x00{content}")[:16]


def _now() -> datetime:
    return datetime.now(UTC)


class Document(BaseModel):
    """A loaded source: its text plus what is needed to decide whether it changed."""

    id: str
    uri: str
    title: str | None = None
    content: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    content_hash: str
    created_at: datetime = Field(default_factory=_now)
    updated_at: datetime = Field(default_factory=_now)

    @classmethod
    def from_text(
        cls,
        content: str,
        *,
        uri: str,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Document:
        return cls(
            id=document_id_for(uri),
            uri=uri,
            title=title,
            content=content,
            metadata=dict(metadata or {}),
            content_hash=sha256_hex(content),
        )


class Chunk(BaseModel):
    """A slice of a document, the unit that is embedded, searched and cited."""

    id: str
    document_id: str
    order: int
    content: str
    start: int = 0
    headings: list[str] = Field(default_factory=list)

    @property
    def content_hash(self) -> str:
        return sha256_hex(self.content)


class SearchResult(BaseModel):
    """A ranked chunk with where it came from and how each signal ranked it."""

    chunk_id: str
    document_id: str
    document_uri: str
    document_title: str | None = None
    content: str
    headings: list[str] = Field(default_factory=list)
    order: int = 0
    score: float
    rank: int
    signal_ranks: dict[str, int] = Field(default_factory=dict)


class Citation(BaseModel):
    """A chunk an answer rests on, as shown to the user."""

    index: int
    chunk_id: str
    document_id: str
    document_uri: str
    document_title: str | None = None
    content: str
    headings: list[str] = Field(default_factory=list)

    @classmethod
    def from_result(cls, index: int, result: SearchResult) -> Citation:
        return cls(
            index=index,
            chunk_id=result.chunk_id,
            document_id=result.document_id,
            document_uri=result.document_uri,
            document_title=result.document_title,
            content=result.content,
            headings=result.headings,
        )
