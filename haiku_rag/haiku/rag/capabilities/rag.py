"""The RAG capability: `search`, `execute_code` and `cite` tools for any Pydantic AI agent.

    from pydantic_ai import Agent
    from haiku.rag.capabilities.rag import create_capability as rag

    agent = Agent("openai:gpt-5", capabilities=[rag(db_path="my.lancedb")])

Per run, the capability (a fresh copy made by `for_run`) holds the knowledge-base
client (its own read-only one, or a borrowed `rag=`), one Monty sandbox (opened on
the first `execute_code`), and the request-limit bookkeeping. Conversation memory
lives in `RAGState` (see `state.py`), in `deps.state["rag"]` when the deps have a
`state` dict.

Prompt-cache notes: the tool list and tool descriptions never change between
requests, except that the request limit removes tools (the issue asks for it);
the instructions are one static block (rag.md, with the domain preamble) plus a
dynamic tail that is empty until a budget is spent, so the cached prefix only
breaks once, at the point the model must wrap up anyway. Message history is never
rewritten here (the compaction companion does that per request, not in history).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import KW_ONLY, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field
from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ModelRetry, ToolFailed
from pydantic_ai.messages import ModelRequest, ToolReturn, UserPromptPart
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import FunctionToolset, ToolsetTool

from haiku.rag.capabilities._toolset import RunScopedToolset
from haiku.rag.capabilities.state import CodeExecutionEntry, RAGState, load_state, prompt_text
from haiku.rag.client import HaikuRAG, resolve_db_path
from haiku.rag.config import AppConfig, load_config
from haiku.rag.documents import SearchResult, document_id_for

if TYPE_CHECKING:
    from pydantic_ai.capabilities.abstract import WrapRunHandler
    from pydantic_ai.run import AgentRunResult

    from haiku.rag.sandbox import MountedDocument, Sandbox

TOOL_KIND = "haiku_rag"
"""Metadata key on our tool definitions and tool returns; survives `prefix_tools`."""

MAX_MOUNTED_DOCUMENTS = 200
CITE_RETRIES = 2
"""Retries a model gets to fix bad chunk ids before `cite` fails without ending the run."""
"""Documents mounted in the sandbox when no filter or sources narrow the question."""
MAX_TOP_K = 20
CITE_GRACE_REQUESTS = 2
CODE_QUERY_PREFIX = "[code] "
_ID_TYPO_DISTANCE = 2

SEARCH_DESCRIPTION = (
    "Hybrid (semantic + keyword) search over the knowledge base. Returns the best chunks, "
    "each with its chunk_id, rank, source and content. Cite the chunk_ids your answer uses."
)
EXECUTE_CODE_DESCRIPTION = (
    "Run Python in a sandbox over the documents, for counting, comparing or reading whole "
    "documents. Each document of the question is mounted read-only at "
    "/documents/<document_id>/ (content.txt, metadata.json, chunks.jsonl with chunk_id per "
    f"line; at most {MAX_MOUNTED_DOCUMENTS} documents when the question is not narrowed to "
    "sources); /documents is the working directory; no network, writes fail. Inside, "
    "`await search(query, top_k=None)` returns rows (chunk_id, content, document_uri, "
    "chunk_meta, ...) that can be cited, and `await list_documents()` returns rows with "
    "metadata. Variables persist between calls. Returns stdout plus the last expression."
)
CITE_DESCRIPTION = (
    "Register the chunks your answer rests on, by chunk_id, before answering. Use ids seen in "
    "this question's results. Call with an empty list when the knowledge base does not "
    "support an answer."
)


@functools.cache
def base_instructions() -> str:
    """The shipped instructions (read once; the text never changes within a process)."""
    return (
        resources.files("haiku.rag.capabilities")
        .joinpath("instructions/rag.md")
        .read_text(encoding="utf-8")
        .strip()
    )


def edit_distance(a: str, b: str, limit: int) -> int:
    """Levenshtein distance, or `limit + 1` as soon as it must exceed `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b))
            )
        if min(current) > limit:
            return limit + 1
        previous = current
    return min(previous[-1], limit + 1)


def closest_id(candidate: str, known: list[str], limit: int = _ID_TYPO_DISTANCE) -> str | None:
    """The one known id within `limit` edits of `candidate`; None when none or ambiguous."""
    scored = sorted((edit_distance(candidate, k, limit), k) for k in known)
    scored = [item for item in scored if item[0] <= limit]
    if not scored or (len(scored) > 1 and scored[0][0] == scored[1][0]):
        return None
    return scored[0][1]


def normalize_chunk_id(raw: str) -> str:
    """Forgive decoration models add around ids: spaces, brackets, quotes, a `chunk_id:` label."""
    text = raw.strip().strip("[](){}<>`'\" ").lower()
    for label in ("chunk_id:", "chunk_id=", "chunk:", "id:"):
        if text.startswith(label):
            text = text[len(label) :].strip()
    return text


def render_results(query: str, results: list[SearchResult]) -> str:
    """Results as the model reads them: id and rank first, then source, headings, content."""
    if not results:
        return f'No results for "{query}".'
    blocks = [f'{len(results)} results for "{query}":']
    for result in results:
        title = result.document_title or result.document_uri
        lines = [f"[chunk_id: {result.chunk_id}] rank {result.rank} | {title}"]
        if result.document_title:
            lines.append(f"uri: {result.document_uri}")
        if result.headings:
            lines.append("section: " + " > ".join(result.headings))
        lines.append(result.content.strip())
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def question_of(ctx: RunContext[Any]) -> str:
    """This run's question: its prompt, or the last user prompt of the history it resumes."""
    text = prompt_text(ctx.prompt)
    if text is not None:
        return text
    for message in reversed(ctx.messages):
        if isinstance(message, ModelRequest):
            for part in reversed(message.parts):
                if isinstance(part, UserPromptPart):
                    return prompt_text(part.content) or ""
    return ""


def _kind(tool_def: ToolDefinition) -> str | None:
    return (tool_def.metadata or {}).get(TOOL_KIND)


def _has_glob(pattern: str) -> bool:
    return any(char in pattern for char in "*?[")


async def _search_signature(
    ctx: RunContext[Any],
    query: str,
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] | None = None,
) -> ToolReturn:
    """Search the knowledge base.

    Args:
        query: What to look for; specific terms work best.
        top_k: How many results (default from the configuration).
    """
    raise NotImplementedError  # schema only: _RAGToolset dispatches to the run's capability


async def _execute_code_signature(ctx: RunContext[Any], code: str) -> ToolReturn:
    """Run Python in the document sandbox.

    Args:
        code: Python source; top-level `await` works; the last expression is shown.
    """
    raise NotImplementedError


async def _cite_signature(ctx: RunContext[Any], chunk_ids: list[str]) -> ToolReturn:
    """Register the chunks the answer rests on.

    Args:
        chunk_ids: chunk_id values from this question's results; [] for no evidence.
    """
    raise NotImplementedError


@functools.cache
def _prototype_toolset() -> FunctionToolset[Any]:
    """The tool definitions, built once per process: schemas cost milliseconds to generate,
    and they are the same for every run (which also keeps them byte-identical for caching)."""
    toolset: FunctionToolset[Any] = FunctionToolset(max_retries=CITE_RETRIES + 1)
    for name, function, description in (
        ("search", _search_signature, SEARCH_DESCRIPTION),
        ("execute_code", _execute_code_signature, EXECUTE_CODE_DESCRIPTION),
        ("cite", _cite_signature, CITE_DESCRIPTION),
    ):
        toolset.add_function(
            function, name=name, description=description, metadata={TOOL_KIND: name}
        )
    return toolset


@dataclass
class _RAGToolset(RunScopedToolset):
    """One run's view of the shared tools: calls go to that run's capability; leaving the
    toolset releases the run's client and sandbox (see `_toolset`)."""

    owner: RAGCapability | None = None

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        assert self.owner is not None
        kind = _kind(tool.tool_def) or name
        return await self.owner.call_tool(kind, ctx, tool_args)


@dataclass
class RAGCapability(AbstractCapability[Any]):
    """Grounded answers from a haiku.rag knowledge base; build it with `create_capability`."""

    db_path: Path | None = None
    config: AppConfig | None = None
    rag: HaikuRAG | None = None
    """A borrowed, already open client; never closed by the capability."""
    request_limit: int | None = 20
    """Model requests per run with the full tool set; None disables the limit."""
    vision: bool | None = None
    """Reserved: pictures are not extracted yet, so `picture_refs` are always empty."""

    _: KW_ONLY

    id: str | None = "haiku_rag"
    description: str | None = (
        "Search, read (with Python) and cite the documents of a knowledge base."
    )

    _client: HaikuRAG | None = field(default=None, init=False, repr=False)
    _sandbox: Sandbox | None = field(default=None, init=False, repr=False)
    _mount_note: str | None = field(default=None, init=False, repr=False)
    _fallback: RAGState | None = field(default=None, init=False, repr=False)
    _grace_steps: set[int] = field(default_factory=set, init=False, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.vision is not None and not isinstance(self.vision, bool):
            raise TypeError(f"vision must be None or a bool, not {self.vision!r}")
        if self.request_limit is not None and self.request_limit < 1:
            raise ValueError(
                f"request_limit must be at least 1 (or None to disable it), "
                f"got {self.request_limit}"
            )
        if self.rag is not None:
            self.config = self.rag.config
            self.db_path = self.rag.path
        else:
            if self.config is None:
                self.config = load_config()
            self.db_path = resolve_db_path(self.db_path, self.config)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a client and a config object; build it with create_capability

    @property
    def app_config(self) -> AppConfig:
        assert self.config is not None  # resolved in __post_init__
        return self.config

    # run lifecycle -------------------------------------------------------------------

    async def for_run(self, ctx: RunContext[Any]) -> RAGCapability:
        """A fresh copy per run; decides whether this run starts a new question."""
        run = replace(self)
        state = run.rag_state(ctx)
        question = question_of(ctx)
        if not ctx.messages or question != state.question:
            state.start_question(question)
        return run

    def rag_state(self, ctx: RunContext[Any]) -> RAGState:
        """`deps.state["rag"]` when the deps carry a state dict, else this run's own state."""
        state = load_state(ctx.deps)
        if state is not None:
            return state
        if self._fallback is None:
            self._fallback = RAGState()
        return self._fallback

    async def wrap_run(
        self, ctx: RunContext[Any], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        try:
            if not self.defer_loading:
                await self.client()  # fail before the first model request if the store is bad
            return await handler()
        finally:
            await self.release()

    async def client(self) -> HaikuRAG:
        """The borrowed client, or this run's own read-only one (opened once)."""
        if self.rag is not None:
            return self.rag
        async with self._lock:
            if self._client is None:
                self._client = await HaikuRAG(self.db_path, self.app_config, read_only=True).open()
        return self._client

    async def release(self) -> None:
        """Close what this run opened: the sandbox, and the client unless it was borrowed."""
        sandbox, self._sandbox = self._sandbox, None
        client, self._client = self._client, None
        try:
            if sandbox is not None:
                await sandbox.aclose()
        finally:
            if client is not None:
                client.close()

    # model-facing contributions ------------------------------------------------------

    def get_instructions(self) -> list[Any]:
        preamble = self.app_config.prompts.domain_preamble
        static = base_instructions()
        if preamble:
            static = f"{preamble.strip()}\n\n{static}"
        return [static, self._budget_instructions]

    async def _budget_instructions(self, ctx: RunContext[Any]) -> str:
        """Names every spent budget, on every request after it is spent (async: a sync
        instruction function would cost a worker-thread hop per request)."""
        state = self.rag_state(ctx)
        qa = self.app_config.qa
        notes = []
        if self._limit_reached(ctx):
            notes.append(
                f"The request limit of this run is reached ({self.request_limit} requests): "
                "`search` and `execute_code` are no longer available. Cite the evidence you "
                "have with `cite` and answer now."
            )
        if state.search_calls >= qa.max_searches:
            notes.append(
                f"The `search` budget of this question is spent (qa.max_searches = "
                f"{qa.max_searches}): `search` will fail. Answer with the evidence you have."
            )
        if len(state.executions) >= qa.max_executions:
            notes.append(
                f"The `execute_code` budget of this question is spent (qa.max_executions = "
                f"{qa.max_executions}): `execute_code` will fail. Answer with what you have."
            )
        return "\n".join(notes)

    def get_toolset(self) -> _RAGToolset:
        return _RAGToolset(_prototype_toolset(), owner=self)

    async def call_tool(self, kind: str, ctx: RunContext[Any], args: dict[str, Any]) -> ToolReturn:
        """Run one of our tools (arguments already validated against the shared schema)."""
        if kind == "search":
            return await self._search(ctx, **args)
        if kind == "execute_code":
            return await self._execute_code(ctx, **args)
        if kind == "cite":
            return await self._cite(ctx, **args)
        raise ValueError(f"unknown haiku.rag tool {kind!r}")

    def _limit_reached(self, ctx: RunContext[Any]) -> bool:
        return self.request_limit is not None and ctx.run_step > self.request_limit

    async def prepare_tools(
        self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]
    ) -> list[ToolDefinition]:
        """Past the request limit: only `cite`, for two more requests that use our tools."""
        if not self._limit_reached(ctx):
            return tool_defs
        hidden = {"search", "execute_code"}
        if len(self._grace_steps) >= CITE_GRACE_REQUESTS:
            hidden.add("cite")
        return [tool_def for tool_def in tool_defs if _kind(tool_def) not in hidden]

    def _note_call(self, ctx: RunContext[Any]) -> None:
        """A post-limit request whose response called our tools uses up one grace request."""
        if self._limit_reached(ctx):
            self._grace_steps.add(ctx.run_step)

    # tools ---------------------------------------------------------------------------

    async def _search(
        self, ctx: RunContext[Any], query: str, top_k: int | None = None
    ) -> ToolReturn:
        """The `search` tool: budgeted, restricted, recorded as retrieved evidence."""
        self._note_call(ctx)
        state = self.rag_state(ctx)
        budget = self.app_config.qa.max_searches
        if state.search_calls >= budget:
            raise ToolFailed(
                f"The search budget of this question is spent ({budget} searches, "
                "qa.max_searches). Do not search again: answer now with the evidence you "
                "have, and cite it."
            )
        state.search_calls += 1
        kb = await self.client()
        results = await self.search_kb(kb, state, query, top_k)
        state.searches[query] = results
        chunk_ids = [result.chunk_id for result in results]
        state.evidence.record_retrieved("search", chunk_ids, query)
        return ToolReturn(
            render_results(query, results),
            metadata={TOOL_KIND: "search", "query": query, "chunk_ids": chunk_ids},
        )

    async def _execute_code(self, ctx: RunContext[Any], code: str) -> ToolReturn:
        """The `execute_code` tool: budgeted; Python errors are tool failures, not crashes."""
        self._note_call(ctx)
        state = self.rag_state(ctx)
        budget = self.app_config.qa.max_executions
        if len(state.executions) >= budget:
            raise ToolFailed(
                f"The execute_code budget of this question is spent ({budget} calls, "
                "qa.max_executions). Do not run more code: answer now with what you have."
            )
        sandbox = await self._sandbox_for(ctx)
        result = await sandbox.run(code)
        found = [hit.chunk_id for hit in result.found]
        state.executions.append(
            CodeExecutionEntry(
                code=code,
                output=result.output,
                error=result.error,
                timed_out=result.timed_out,
                restarted=result.restarted,
                found_chunk_ids=found,
            )
        )
        parts = []
        if self._mount_note is not None:  # said once, with the first result
            parts.append(self._mount_note)
            self._mount_note = None
        if result.restarted:
            parts.append(
                "Note: the sandbox was restarted after an earlier timeout or crash; variables "
                "from earlier calls are gone."
            )
        if result.output:
            parts.append(result.output)
        if result.error is not None:
            parts.append(result.error)
            raise ToolFailed("\n".join(parts))
        if not result.output:
            parts.append("(no output)")
        if found:
            parts.append("Citable chunk ids found by search(): " + ", ".join(found))
        return ToolReturn(
            "\n".join(parts), metadata={TOOL_KIND: "execute_code", "chunk_ids": found}
        )

    async def _cite(self, ctx: RunContext[Any], chunk_ids: list[str]) -> ToolReturn:
        """The `cite` tool: resolve ids (typos, store), register citations, declare evidence."""
        self._note_call(ctx)
        state = self.rag_state(ctx)
        if not chunk_ids:
            state.evidence.record_declared([])
            return ToolReturn(
                "Recorded: the knowledge base does not support this answer (ungrounded). "
                "Say so in your answer.",
                metadata={TOOL_KIND: "cite", "citations": []},
            )
        results, unknown = await self._resolve(state, chunk_ids)
        if unknown:
            known = list(state.retrieved_results())
            if known:
                hint = "Valid chunk ids from this question: " + ", ".join(known[:30])
            else:
                hint = (
                    "Nothing was retrieved for this question yet: search first, or call "
                    "cite([]) if the knowledge base does not answer it."
                )
            message = (
                f"Unknown chunk ids: {', '.join(unknown)}. Nothing was registered; call cite "
                f"again with exact ids. {hint}"
            )
            if ctx.retry >= CITE_RETRIES:
                # Out of retries: a failed result the run survives (the question stays
                # `missing`) instead of an exception that loses the whole answer.
                raise ToolFailed(message + " Or answer without citations.")
            raise ModelRetry(message)
        citations = [state.register_citation(result) for result in results]
        state.evidence.record_declared([result.chunk_id for result in results])
        lines = ["Registered citations:"]
        lines += [
            f"[{c.index}] {c.document_title or c.document_uri} (chunk {c.chunk_id})"
            for c in citations
        ]
        return ToolReturn(
            "\n".join(lines),
            metadata={
                TOOL_KIND: "cite",
                "citations": [c.model_dump(mode="json") for c in citations],
            },
        )

    # helpers -------------------------------------------------------------------------

    async def allowed_document_ids(self, kb: HaikuRAG, state: RAGState) -> set[str] | None:
        """Documents the question may use (None: all), from `document_filter` and `sources`."""
        allowed: set[str] | None = None
        if state.document_filter:
            allowed = await kb.filter_document_ids(state.document_filter)
        if state.sources is not None:
            chosen: set[str] = set()
            for source in state.sources:
                if _has_glob(source):
                    chosen |= await kb.filter_document_ids(source)
                    continue
                chosen |= {source, document_id_for(source)}
                path = Path(source).expanduser()
                if path.exists():
                    chosen.add(document_id_for(path.resolve().as_uri()))
            allowed = chosen if allowed is None else allowed & chosen
        return allowed

    async def search_kb(
        self, kb: HaikuRAG, state: RAGState, query: str, top_k: int | None
    ) -> list[SearchResult]:
        """The hybrid search, restricted to what the question may use."""
        allowed = await self.allowed_document_ids(kb, state)
        if allowed is not None and not allowed:
            return []
        return await kb.retriever.search(query, top_k=top_k, document_ids=allowed)

    async def _sandbox_for(self, ctx: RunContext[Any]) -> Sandbox:
        """The run's sandbox, created on first use with the question's documents mounted."""
        from haiku.rag.sandbox import Sandbox

        kb = await self.client()
        async with self._lock:
            if self._sandbox is None:
                state = self.rag_state(ctx)
                allowed = await self.allowed_document_ids(kb, state)
                documents = await mount_documents(kb, allowed)
                if allowed is None:
                    total = str(await asyncio.to_thread(kb.store.count_documents))
                else:  # `allowed` holds candidate ids; only a full cap says more exist
                    total = "at least " + str(len(documents) + 1)
                    if len(documents) < MAX_MOUNTED_DOCUMENTS:
                        total = str(len(documents))
                if total != str(len(documents)):  # the cap cut the question's documents
                    self._mount_note = (
                        f"Note: {len(documents)} of {total} documents are mounted under "
                        "/documents (narrow the question with document_filter or sources to "
                        "mount others); await search() inside still covers all of them."
                    )
                self._sandbox = Sandbox(
                    documents, self._code_search(ctx, kb), self.app_config.sandbox
                )
            return self._sandbox

    def _code_search(self, ctx: RunContext[Any], kb: HaikuRAG) -> Any:
        """`await search(q)` inside the sandbox: same search, citable, not budgeted."""

        async def search(query: str, top_k: int | None) -> list[SearchResult]:
            state = self.rag_state(ctx)
            results = await self.search_kb(kb, state, query, top_k)
            state.searches[CODE_QUERY_PREFIX + query] = results
            state.evidence.record_retrieved(
                "execute_code", [result.chunk_id for result in results], query
            )
            return results

        return search

    async def _mounted_documents(self, kb: HaikuRAG, state: RAGState) -> list[MountedDocument]:
        return await mount_documents(kb, await self.allowed_document_ids(kb, state))

    async def _resolve(
        self, state: RAGState, raw_ids: list[str]
    ) -> tuple[list[SearchResult], list[str]]:
        """Ids -> results: this question's retrievals, then the store, then typo matches."""
        known = state.retrieved_results()
        wanted = [(raw, normalize_chunk_id(raw)) for raw in raw_ids]
        missing = [cid for _, cid in wanted if cid not in known]
        stored = await self._from_store(state, missing) if missing else {}
        resolved: dict[str, SearchResult] = {}
        unknown: list[str] = []
        for raw, cid in wanted:
            result = known.get(cid) or stored.get(cid)
            if result is None and (match := closest_id(cid, list(known))) is not None:
                result = known[match]
            if result is None:
                unknown.append(raw)
            else:
                resolved.setdefault(result.chunk_id, result)
        return list(resolved.values()), unknown

    async def _from_store(self, state: RAGState, chunk_ids: list[str]) -> dict[str, SearchResult]:
        """Chunks cited without being retrieved in this question (e.g. read from chunks.jsonl),
        as long as they belong to documents the question may use."""
        kb = await self.client()
        store = kb.store
        chunks = await asyncio.to_thread(store.get_chunks, chunk_ids)
        allowed = await self.allowed_document_ids(kb, state)
        chunks = [c for c in chunks if allowed is None or c.document_id in allowed]
        documents = {
            document.id: document
            for document in await asyncio.to_thread(
                store.get_documents, [chunk.document_id for chunk in chunks]
            )
        }
        found: dict[str, SearchResult] = {}
        for chunk in chunks:
            document = documents.get(chunk.document_id)
            if document is None:
                continue
            found[chunk.id] = SearchResult(
                chunk_id=chunk.id,
                document_id=document.id,
                document_uri=document.uri,
                document_title=document.title,
                content=chunk.content,
                headings=chunk.headings,
                order=chunk.order,
                score=0.0,
                rank=0,
            )
        return found


async def mount_documents(kb: HaikuRAG, allowed: set[str] | None) -> list[MountedDocument]:
    """What a sandbox mounts: the `allowed` documents, or (None) the first
    MAX_MOUNTED_DOCUMENTS of the store; shared with the MCP server's `execute_code`."""
    from haiku.rag.sandbox import MountedDocument

    store = kb.store
    if allowed is None:
        documents = await kb.list_documents(limit=MAX_MOUNTED_DOCUMENTS)
    else:
        # The first MAX_MOUNTED_DOCUMENTS that exist, by id; fetched a page at a time
        # (`allowed` holds candidate ids, and may be large).
        ordered = sorted(allowed)
        documents = []
        for start in range(0, len(ordered), MAX_MOUNTED_DOCUMENTS):
            page = ordered[start : start + MAX_MOUNTED_DOCUMENTS]
            fetched = await asyncio.to_thread(store.get_documents, page)
            documents.extend(sorted(fetched, key=lambda document: document.id))
            if len(documents) >= MAX_MOUNTED_DOCUMENTS:
                break
        documents = documents[:MAX_MOUNTED_DOCUMENTS]
    mounted = []
    for document in documents:
        chunks = await asyncio.to_thread(store.document_chunks, document.id)
        mounted.append(MountedDocument(document=document, chunks=chunks))
    return mounted


def create_capability(
    db_path: str | Path | None = None,
    config: AppConfig | None = None,
    *,
    rag: HaikuRAG | None = None,
    request_limit: int | None = 20,
    defer_loading: bool = False,
    vision: bool | None = None,
) -> RAGCapability:
    """The RAG capability for `Agent(model, capabilities=[...])`.

    Args:
        db_path: The knowledge base; default `HAIKU_RAG_DB`, then the config's data dir.
        config: Settings (qa budgets, sandbox, prompts); default: the loaded config file.
        rag: An open `HaikuRAG` to use instead of opening one; the caller closes it.
        request_limit: Model requests per run with all tools (None: unlimited); after it
            only `cite` stays, for two more requests that use the capability's tools.
        defer_loading: Pydantic AI deferred loading: the tools and instructions stay hidden
            until the model loads the capability (`load_capability`), and the store is
            opened on the first tool call instead of when the run starts.
        vision: Reserved for picture extraction; accepted but unused (`picture_refs` are
            always empty).
    """
    if rag is not None and db_path is not None:
        raise ValueError("pass either db_path or rag=, not both")
    return RAGCapability(
        db_path=Path(db_path) if db_path is not None else None,
        config=config,
        rag=rag,
        request_limit=request_limit,
        vision=vision,
        defer_loading=defer_loading,
    )
