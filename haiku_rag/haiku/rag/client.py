"""`HaikuRAG`: the one object users hold; it opens a store and runs ingest and search on it.

The client owns no storage logic of its own: it resolves the path and driver,
checks that the store matches the embedder, and wires sources -> ingest ->
store -> retrieval together.
"""

from __future__ import annotations

import asyncio
import fnmatch
import importlib
import os
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, overload

from haiku.rag.chunking import default_overlap
from haiku.rag.config import DEFAULT_CHUNK_SIZE, AppConfig, load_config
from haiku.rag.documents import Citation, Document, SearchResult, document_id_for
from haiku.rag.embeddings import EmbeddingService
from haiku.rag.errors import (
    ConfigError,
    HaikuRAGError,
    ReadOnlyError,
    StoreError,
    StoreNotFoundError,
)
from haiku.rag.ingest import AddReport, ids_for_uris, plan_changes, write_documents
from haiku.rag.progress import NoProgress, Progress
from haiku.rag.retrieval.extract import ChunkExtractor
from haiku.rag.retrieval.graph import (
    GraphSignal,
    GraphStats,
    GraphUpdate,
    KnowledgeGraph,
    load_graph,
    update_graph,
)
from haiku.rag.retrieval.hybrid import GRAPH_SIGNAL, HybridRetriever
from haiku.rag.retrieval.rerank import Reranker, make_reranker
from haiku.rag.retrieval.signals import default_signals
from haiku.rag.sources import CommandPolicy, load_sources
from haiku.rag.store import DRIVERS, driver_class, infer_driver
from haiku.rag.store.base import Store, StoreSettings

DB_ENV = "HAIKU_RAG_DB"
OPTIMIZE_AFTER_CHUNKS = 1000
"""Adds that embed at least this many chunks end with the driver's maintenance pass."""


def is_url(location: str | Path | None) -> bool:
    return isinstance(location, str) and "://" in location


def resolve_db_path(db_path: str | Path | None, config: AppConfig) -> Path:
    """The argument, else `HAIKU_RAG_DB`, else the default store in the data dir."""
    if db_path is not None:
        return Path(db_path).expanduser()
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    return config.storage.default_db_path


@dataclass(frozen=True)
class ChunkPlan:
    size: int
    overlap: int
    reason: str
    """Why this size: set by the user, the default, or capped to the embedder's window."""


def plan_chunking(config: AppConfig, max_input_chars: int | None) -> ChunkPlan:
    """Size chunks to the embedder unless the user chose a size, so no text is silently cut."""
    chunking = config.chunking
    if chunking.size is not None:
        size, reason = chunking.size, "set in config"
    elif max_input_chars is not None and max_input_chars < DEFAULT_CHUNK_SIZE:
        size = max_input_chars
        reason = f"capped to the embedder's window of ~{max_input_chars} characters"
    else:
        size, reason = DEFAULT_CHUNK_SIZE, "default"
    overlap = chunking.overlap if chunking.overlap is not None else default_overlap(size)
    return ChunkPlan(size=size, overlap=min(overlap, size - 1), reason=reason)


@dataclass(frozen=True)
class StoreInfo:
    path: str
    driver: str
    documents: int | None
    """None when the driver cannot count cheaply (a large attached collection)."""
    chunks: int | None
    embedding_model: str
    embedding_dim: int
    chunk_size: int
    chunk_overlap: int
    signals: list[str]
    read_only: bool
    """The driver cannot write at all (an attached collection), however it was opened."""
    config_file: str | None
    extra: dict[str, Any] = field(default_factory=dict)


class _OpenMethod:
    """`HaikuRAG.open(name, ...)` on the class is `HaikuRAG.named` (a knowledge base by
    name); `await kb.open()` on an instance opens its store. One word reads right in
    both places, so the descriptor dispatches on how it is reached."""

    def __init__(self, method: Callable[[Any], Awaitable[Any]]) -> None:
        self._method = method
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, instance: None, owner: type[HaikuRAG]) -> Callable[..., HaikuRAG]: ...

    @overload
    def __get__(
        self, instance: HaikuRAG, owner: type[HaikuRAG] | None = None
    ) -> Callable[[], Awaitable[HaikuRAG]]: ...

    def __get__(self, instance: HaikuRAG | None, owner: type[HaikuRAG] | None = None) -> Any:
        if instance is None:
            assert owner is not None
            return owner.named
        return self._method.__get__(instance, owner)


class HaikuRAG:
    """A knowledge base: `async with HaikuRAG("kb.lancedb", create=True) as kb: ...`,
    or by name: `async with HaikuRAG.open("notes") as kb: ...` (see `named`)."""

    rag_name: str | None = None
    """The knowledge base's name when it was opened by name (`named`), else None."""

    def __init__(
        self,
        db_path: str | Path | None = None,
        config: AppConfig | None = None,
        *,
        create: bool = False,
        read_only: bool = False,
        driver: str | None = None,
    ) -> None:
        self.config = config if config is not None else load_config()
        self.path = resolve_db_path(db_path, self.config)
        # URLs (qdrant://host/collection) must not go through Path, which eats a slash.
        self.location = str(db_path) if is_url(db_path) else str(self.path)
        self.driver = infer_driver(self.path, driver or self.config.storage.driver)
        self.create = create
        self.read_only = read_only
        self._store: Store | None = None
        self._embedder: EmbeddingService | None = None
        self._retriever: HybridRetriever | None = None
        self._lock = asyncio.Lock()
        self._created = False
        """This client created the store when it opened (so it may discard it, still empty)."""
        self.extractor: ChunkExtractor | None = ChunkExtractor.from_config(self.config.graph)
        """Extracts the knowledge graph from new chunks (graph.extractor_model); assign
        another ChunkExtractor to use a model object instead of a name."""
        self._reranker: Reranker | None = make_reranker(self.config.search.reranker_model)
        self._graph: KnowledgeGraph | None = None

    @classmethod
    def named(
        cls,
        name: str,
        config: AppConfig | None = None,
        *,
        create: bool = False,
        driver: str | None = None,
        read_only: bool = False,
    ) -> Self:
        """The knowledge base called `name` in the rags dir, not yet opened (also spelled
        `HaikuRAG.open(name)`): use `async with` or `await kb.open()`.

        Whatever its driver, an existing one opens with it (`driver`, if given, must
        agree). A missing name raises StoreNotFoundError now, unless `create`: then it
        is made with `driver` (else `storage.driver`, else lancedb) on first open.
        See `haiku.rag.rags` for the rags dir and the file layout.
        """
        from haiku.rag.rags import resolve_rag

        config = config if config is not None else load_config()
        entry = resolve_rag(name, config, create=create, driver=driver)
        client = cls(
            entry.location, config, create=create, read_only=read_only, driver=entry.driver
        )
        client.rag_name = entry.name
        return client

    # lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @_OpenMethod
    async def open(self) -> Self:
        """Open (or, with `create`, make) the store; returns self. Idempotent."""
        if self._store is not None:
            return self
        cls = driver_class(self.driver)
        try:
            store = await asyncio.to_thread(
                cls.open, self.location, read_only=self.read_only, **self._open_options()
            )
        except StoreNotFoundError:
            if not self.create or self.read_only:
                raise
            store = await self._create_store(cls)
            self._created = True
        self._store = store
        _warn_on_chunking_drift(self.config, store.settings, self.location)
        try:
            self._embedder = self._embedder_for(store.settings)
            self._graph = await asyncio.to_thread(load_graph, store)
        except HaikuRAGError:
            store.close()
            self._store = None
            raise
        self._retriever = self._make_retriever(store)
        return self

    def _open_options(self) -> dict[str, Any]:
        """Driver-specific open arguments. Only an attached Qdrant collection needs one:
        nothing on the server records the embedding model, so the config names it."""
        embeddings = self.config.embeddings
        if self.driver == "qdrant" and "model" in embeddings.model_fields_set:
            return {"embedding_model": embeddings.model}
        return {}

    async def _create_store(self, cls: type[Store]) -> Store:
        embedder = EmbeddingService.from_config(self.config.embeddings)
        dimension = await embedder.dimension()
        chunking = plan_chunking(self.config, embedder.max_input_chars)
        settings = StoreSettings(
            driver=self.driver,
            embedding_model=embedder.model_name,
            embedding_dim=dimension,
            chunk_size=chunking.size,
            chunk_overlap=chunking.overlap,
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._embedder = embedder
        return await asyncio.to_thread(cls.create, self.location, settings)

    def _embedder_for(self, settings: StoreSettings) -> EmbeddingService:
        """The store's model wins unless the user explicitly configured another one.

        `embeddings.query_model`, when set, embeds the queries; it must make vectors of
        the store's dimension (checked here when its size is known, else on the first
        query), so a mismatch fails naming both models instead of searching nonsense.
        """
        embeddings = self.config.embeddings
        if "model" in embeddings.model_fields_set and embeddings.model != settings.embedding_model:
            raise StoreError(
                f"{self.path} was built with embedding model {settings.embedding_model!r} "
                f"but the config asks for {embeddings.model!r}: set embeddings.model to "
                f"{settings.embedding_model!r}, or add your documents to a new store"
            )
        if embeddings.dimension is not None and embeddings.dimension != settings.embedding_dim:
            raise StoreError(
                f"{self.path} holds {settings.embedding_dim}-dimensional vectors but the config "
                f"sets embeddings.dimension to {embeddings.dimension}: remove the setting, or "
                f"add your documents to a new store"
            )
        if self._embedder is not None and self._embedder.model_name == settings.embedding_model:
            return self._embedder
        pinned = embeddings.model_copy(
            update={"model": settings.embedding_model, "dimension": settings.embedding_dim}
        )
        return EmbeddingService.from_config(pinned)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
            self._retriever = None
            self._graph = None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise HaikuRAGError(
                "The knowledge base is not open: use `async with HaikuRAG(...)` or await open()"
            )
        return self._store

    def _check_writable(self) -> Store:
        """Refuse a write before any work (loading, embedding) is spent on it."""
        store = self.store
        if not store.features.writable:
            raise ReadOnlyError(
                f"Cannot write to {self.location}: the {store.settings.driver} driver is "
                "read-only; change the documents where the collection is built"
            )
        if self.read_only or store.read_only:
            raise ReadOnlyError(
                f"Cannot write to {self.location}: it was opened read-only; open it "
                "without read_only to change it"
            )
        return store

    @property
    def embedder(self) -> EmbeddingService:
        self.store  # noqa: B018 - raises the clear "not open" error
        assert self._embedder is not None
        return self._embedder

    @property
    def retriever(self) -> HybridRetriever:
        self.store  # noqa: B018
        assert self._retriever is not None
        return self._retriever

    @property
    def reranker(self) -> Reranker | None:
        """Re-scores candidates instead of RRF (search.reranker_model); None: RRF."""
        return self._reranker

    @reranker.setter
    def reranker(self, reranker: Reranker | None) -> None:
        self._reranker = reranker
        if self._retriever is not None:
            self._retriever.reranker = reranker

    def _make_retriever(self, store: Store) -> HybridRetriever:
        """Vector (and BM25 where the store has it); graph only once the store has a
        non-empty graph, so a knowledge base without one pays nothing for it."""
        assert self._embedder is not None
        signals = default_signals(store)
        if self._graph is not None and not self._graph.empty:
            graph = self.config.graph
            signals.append(
                GraphSignal(store, self._graph, hops=graph.hops, max_entities=graph.max_entities)
            )
        return HybridRetriever(
            store, self._embedder, self.config.search, signals=signals, reranker=self._reranker
        )

    async def _update_graph(
        self, progress: Progress | None = None, *, full: bool = False, extract: bool = True
    ) -> GraphUpdate:
        """Bring the graph in line with the stored documents (see `update_graph`); a no-op
        without a graph and an extractor. Call with the write lock held."""
        if self._graph is None:
            return GraphUpdate()
        extractor = self.extractor if extract else None
        try:
            return await update_graph(
                self.store, self._graph, extractor, full=full, progress=progress
            )
        finally:
            self._retriever = self._make_retriever(self.store)

    async def graph_stats(self, top: int = 10) -> GraphStats | None:
        """Entity and relationship counts and the `top` entities; None when the driver
        keeps no graph."""
        self.store  # noqa: B018
        return None if self._graph is None else self._graph.stats(top)

    # ingest --------------------------------------------------------------------

    async def add(
        self,
        *sources: str | os.PathLike[str],
        prune: bool = True,
        progress: Progress | None = None,
        allow_commands: bool = False,
    ) -> AddReport:
        """Bring the store up to date with `sources`: embed only what is new or changed.

        With `prune`, documents that a directory or glob source used to hold but no
        longer does are deleted. Configured document loaders always apply;
        `` `cmd` `` sources run a shell command, so they need `allow_commands=True`
        (pass it only for specs a person typed, never for an agent's or a client's).
        """
        store = self._check_writable()
        commands = CommandPolicy.from_config(self.config, allow_commands=allow_commands)
        try:
            batch = await load_sources([os.fspath(source) for source in sources], commands=commands)
        except HaikuRAGError:
            await self._discard_if_just_created()
            raise
        async with self._lock:
            stored = await asyncio.to_thread(store.document_hashes)
            changes = plan_changes(
                batch.documents,
                stored,
                batch.scopes if prune else (),
                failed=[failure.uri for failure in batch.failures],
            )
            settings = store.settings
            changed = [await self._keep_created_at(doc) for doc in changes.changed]
            embedded = await write_documents(
                store,
                self.embedder,
                changes.new + changed,
                chunk_size=settings.chunk_size,
                chunk_overlap=settings.chunk_overlap,
                progress=progress,
            )
            if changes.removed:
                await asyncio.to_thread(store.delete_documents, ids_for_uris(changes.removed))
            if embedded >= OPTIMIZE_AFTER_CHUNKS:
                await self._optimize()
            graph = await self._update_graph(progress)
        return AddReport(
            added=[doc.uri for doc in changes.new],
            updated=[doc.uri for doc in changes.changed],
            unchanged=[doc.uri for doc in changes.unchanged],
            deleted=changes.removed,
            failed=batch.failures,
            chunks_embedded=embedded,
            chunks_extracted=graph.extracted,
        )

    async def _discard_if_just_created(self) -> None:
        """A typo in a source must not leave a new, empty store behind."""
        if not self._created or await asyncio.to_thread(self.store.count_documents):
            return
        module_name = DRIVERS[self.driver].partition(":")[0]
        delete_store = getattr(importlib.import_module(module_name), "delete_store", None)
        self.close()
        if delete_store is not None:
            await asyncio.to_thread(delete_store, self.location)

    async def _keep_created_at(self, document: Document) -> Document:
        """A changed document is the same document: it keeps the date it was first added."""
        stored = await asyncio.to_thread(self.store.get_document, document.id)
        if stored is None:
            return document
        return document.model_copy(update={"created_at": stored.created_at})

    async def _optimize(self) -> None:
        """Let drivers that have maintenance (compaction, ANN index) run it after big writes."""
        optimize = getattr(self.store, "optimize", None)
        if optimize is not None:
            await asyncio.to_thread(optimize)

    async def add_text(
        self,
        text: str,
        *,
        uri: str | None = None,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Document:
        """Store `text` as a document (replacing an earlier one with the same uri)."""
        from haiku.rag.documents import sha256_hex

        document = Document.from_text(
            text,
            uri=uri or f"text:{sha256_hex(text)[:16]}",
            title=title,
            metadata=metadata,
        )
        store = self._check_writable()
        async with self._lock:
            if (await asyncio.to_thread(store.document_hashes)).get(document.uri) != (
                document.content_hash
            ):
                document = await self._keep_created_at(document)
                settings = store.settings
                await write_documents(
                    store,
                    self.embedder,
                    [document],
                    chunk_size=settings.chunk_size,
                    chunk_overlap=settings.chunk_overlap,
                )
                await self._update_graph()
        return document

    async def rebuild(self, progress: Progress | None = None) -> int:
        """Re-chunk and re-embed every document, and re-link every chunk into the graph
        (cached extractions are reused; chunks skipped earlier are retried). Returns the
        number of chunks embedded."""
        store = self._check_writable()
        async with self._lock:
            documents = await asyncio.to_thread(store.list_documents)
            settings = store.settings
            embedded = await write_documents(
                store,
                self.embedder,
                documents,
                chunk_size=settings.chunk_size,
                chunk_overlap=settings.chunk_overlap,
                progress=progress or NoProgress(),
            )
            await self._optimize()
            await self._update_graph(progress, full=True)
            return embedded

    async def delete_document(self, id_or_uri: str) -> bool:
        self._check_writable()
        document = await self.get_document(id_or_uri)
        if document is None:
            return False
        async with self._lock:
            await asyncio.to_thread(self.store.delete_documents, [document.id])
            await self._update_graph(extract=False)
        return True

    # read ----------------------------------------------------------------------

    async def get_document(self, id_or_uri: str) -> Document | None:
        """Look a document up by id, by uri, or by a file path that resolves to its uri."""
        store = self.store
        candidates = [id_or_uri, document_id_for(id_or_uri)]
        if ":" not in id_or_uri:  # a path, even of a file deleted since it was added
            candidates.append(document_id_for(Path(id_or_uri).expanduser().resolve().as_uri()))
        for candidate in candidates:
            document = await asyncio.to_thread(store.get_document, candidate)
            if document is not None:
                return document
        return None

    async def list_documents(self, limit: int | None = None, offset: int = 0) -> list[Document]:
        return await asyncio.to_thread(self.store.list_documents, limit, offset)

    async def search(
        self, query: str, top_k: int | None = None, filter: str | None = None
    ) -> list[SearchResult]:
        """Hybrid search; `filter` keeps documents whose uri matches a glob or contains it."""
        document_ids = await self.filter_document_ids(filter) if filter else None
        if document_ids is not None and not document_ids:
            return []
        return await self.retriever.search(query, top_k=top_k, document_ids=document_ids)

    async def filter_document_ids(self, filter: str) -> set[str]:
        uris = await asyncio.to_thread(self.store.document_hashes)
        return {document_id_for(uri) for uri in uris if uri_matches(uri, filter)}

    async def info(self) -> StoreInfo:
        store = self.store
        settings = store.settings
        documents, chunks = await asyncio.gather(
            _count_or_unknown(store.count_documents), _count_or_unknown(store.count_chunks)
        )
        # The signals search runs: graph once the store has one, but not under a reranker.
        signals = [
            name
            for name in self.retriever.signal_names
            if name != GRAPH_SIGNAL or self.reranker is None
        ]
        chunking = plan_chunking(self.config, self.embedder.max_input_chars)
        extra: dict[str, Any] = {}
        if self._graph is not None and not self._graph.empty:
            extra["graph"] = (
                f"{self._graph.entity_count} entities, {self._graph.relationship_count} "
                f"relationships, from {len(self._graph.chunks)} chunks"
            )
        if self.reranker is not None:
            extra["reranker"] = getattr(self.reranker, "model_name", type(self.reranker).__name__)
        if chunking.size == settings.chunk_size:
            extra["chunk_size_reason"] = chunking.reason
        if self.embedder.query_model_name is not None:
            extra["query_model"] = self.embedder.query_model_name
        if self.rag_name is not None:
            extra["rag"] = self.rag_name
        return StoreInfo(
            path=self.location,
            driver=settings.driver,
            documents=documents,
            chunks=chunks,
            embedding_model=settings.embedding_model,
            embedding_dim=settings.embedding_dim,
            chunk_size=settings.chunk_size,
            chunk_overlap=settings.chunk_overlap,
            signals=signals,
            read_only=not store.features.writable,
            config_file=str(self.config.source_path) if self.config.source_path else None,
            extra=extra,
        )

    # answer --------------------------------------------------------------------

    async def ask(
        self,
        question: str,
        filter: str | None = None,
        *,
        model: Any = None,
        inject: bool = False,
    ) -> tuple[str, list[Citation]]:
        """Answer `question` with an agent using the RAG capability over this store.

        `model` overrides `qa.model` (a Pydantic AI model or `provider:name`); `filter`
        narrows the documents as in `search`. Returns the answer and its citations.
        With `inject`, the context capability is used instead: the filled RAG template
        goes with the question (citations: the injected chunks, by source number).
        """
        from pydantic_ai import Agent

        from haiku.rag.capabilities.rag import create_capability
        from haiku.rag.capabilities.state import RAGDeps, RAGState

        chosen = model if model is not None else self.config.qa.model
        if chosen is None:
            raise ConfigError(
                "No chat model for `ask`: set qa.model in the config (e.g. 'openai:gpt-5'), "
                "or pass one (--model on the command line, model= in Python)"
            )
        self.store  # noqa: B018 - the clear "not open" error before any model call
        if inject:
            from haiku.rag.capabilities import context

            injected = context.ContextState()
            capability = context.create_capability(rag=self, filter=filter)
            injecting = Agent(chosen, capabilities=[capability], deps_type=RAGDeps)
            deps = RAGDeps(state={context.STATE_KEY: injected})
            output = (await injecting.run(question, deps=deps)).output
            return output, injected.citations()
        state = RAGState(document_filter=filter)
        agent = Agent(chosen, capabilities=[create_capability(rag=self)], deps_type=RAGDeps)
        result = await agent.run(question, deps=RAGDeps(state={"rag": state}))
        return result.output, state.cited()


def _warn_on_chunking_drift(config: AppConfig, settings: StoreSettings, location: str) -> None:
    """Chunking is fixed when a store is created; say so rather than ignore a new setting."""
    chunking = config.chunking
    asked = {
        "chunking.size": (chunking.size, settings.chunk_size),
        "chunking.overlap": (chunking.overlap, settings.chunk_overlap),
    }
    for key, (wanted, stored) in asked.items():
        if wanted is not None and wanted != stored and settings.chunk_size > 0:
            warnings.warn(
                f"{key} is {wanted} in the config but {location} was built with {stored}; "
                "chunking is fixed when a store is created: add the documents to a new "
                "store to use the new setting",
                UserWarning,
                stacklevel=3,
            )


async def _count_or_unknown(count: Callable[[], int]) -> int | None:
    try:
        return await asyncio.to_thread(count)
    except StoreError:
        return None


def uri_matches(uri: str, pattern: str) -> bool:
    """Case-insensitive glob match, or substring match when `pattern` has no wildcard.

    A glob without a scheme matches the end of the uri, so `docs/*.md` finds
    `file:///home/me/docs/a.md` as a user would expect."""
    uri_l, pattern_l = uri.lower(), pattern.lower()
    if any(char in pattern for char in "*?["):
        if "://" not in pattern_l and not pattern_l.startswith("*"):
            pattern_l = "*" + pattern_l
        return fnmatch.fnmatchcase(uri_l, pattern_l)
    return pattern_l in uri_l
