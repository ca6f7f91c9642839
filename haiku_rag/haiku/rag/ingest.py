"""Incremental ingestion: decide what changed, then chunk, embed and write only that.

Documents are compared by content hash against what the store holds. Writes go
in groups of documents, each group one atomic `Store.write`, so an interruption
leaves every document either at its previous or at its new version.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from haiku.rag.chunking import chunk_document
from haiku.rag.documents import Chunk, Document, document_id_for
from haiku.rag.embeddings import EmbeddingService
from haiku.rag.progress import NoProgress, Progress
from haiku.rag.sources import Scope, SourceFailure
from haiku.rag.store.base import Store

WRITE_GROUP_DOCUMENTS = 64
"""Documents per atomic write: bounds memory and the work lost to an interruption."""


@dataclass(frozen=True)
class ChangeSet:
    new: list[Document]
    changed: list[Document]
    unchanged: list[Document]
    removed: list[str]
    """uris the store holds, inside a source's scope, that the source no longer yields."""

    @property
    def to_write(self) -> list[Document]:
        return self.new + self.changed


@dataclass
class AddReport:
    """What an `add` did, for the CLI summary and for callers that check it."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failed: list[SourceFailure] = field(default_factory=list)
    chunks_embedded: int = 0
    chunks_extracted: int = 0
    """Chunks sent to the graph extractor (0 without graph.extractor_model)."""

    def summary(self) -> str:
        parts = [
            f"{len(self.added)} added",
            f"{len(self.updated)} updated",
            f"{len(self.unchanged)} unchanged",
            f"{len(self.deleted)} deleted",
            f"{len(self.failed)} failed",
        ]
        embedded = (
            f"{self.chunks_embedded} chunks embedded"
            if self.chunks_embedded
            else "nothing to embed"
        )
        extracted = (
            f"; {self.chunks_extracted} chunks extracted to the graph"
            if self.chunks_extracted
            else ""
        )
        return ", ".join(parts) + f"; {embedded}{extracted}"


def plan_changes(
    documents: Sequence[Document],
    stored_hashes: dict[str, str],
    scopes: Iterable[Scope] = (),
    failed: Iterable[str] = (),
) -> ChangeSet:
    """Classify loaded documents against the store; find stored uris whose source vanished.

    A uri that failed to load this time is not "vanished": it keeps its stored version.
    """
    new, changed, unchanged = [], [], []
    for document in documents:
        stored = stored_hashes.get(document.uri)
        if stored is None:
            new.append(document)
        elif stored != document.content_hash:
            changed.append(document)
        else:
            unchanged.append(document)
    loaded = {document.uri for document in documents}
    failed_uris = set(failed)
    scopes = list(scopes)
    # `x.zip#entry` came from a loader run on x.zip: if x.zip failed, its entries stay.
    removed = sorted(
        uri
        for uri in stored_hashes
        if uri not in loaded
        and uri not in failed_uris
        and uri.partition("#")[0] not in failed_uris
        and any(scope.covers(uri) for scope in scopes)
    )
    return ChangeSet(new=new, changed=changed, unchanged=unchanged, removed=removed)


def _groups(documents: Sequence[Document], size: int) -> Iterable[Sequence[Document]]:
    for start in range(0, len(documents), size):
        yield documents[start : start + size]


async def write_documents(
    store: Store,
    embedder: EmbeddingService,
    documents: Sequence[Document],
    *,
    chunk_size: int,
    chunk_overlap: int,
    progress: Progress | None = None,
    group_size: int = WRITE_GROUP_DOCUMENTS,
) -> int:
    """Chunk, embed and write `documents`; returns the number of chunks embedded."""
    progress = progress or NoProgress()
    chunked = [(doc, chunk_document(doc, chunk_size, chunk_overlap)) for doc in documents]
    total_chunks = sum(len(chunks) for _, chunks in chunked)
    progress.start("documents", len(documents))
    progress.start("chunks", total_chunks)
    written = 0
    for start in range(0, len(chunked), group_size):
        group = chunked[start : start + group_size]
        chunks: list[Chunk] = [chunk for _, doc_chunks in group for chunk in doc_chunks]
        vectors = await embedder.embed_documents(
            [chunk.content for chunk in chunks],
            on_batch=lambda n: progress.advance("chunks", n),
        )
        await asyncio.to_thread(store.write, [doc for doc, _ in group], chunks, vectors)
        written += len(chunks)
        progress.advance("documents", len(group))
    return written


def ids_for_uris(uris: Iterable[str]) -> list[str]:
    return [document_id_for(uri) for uri in uris]
