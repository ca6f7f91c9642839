"""The context capability: retrieved chunks injected up front, and a `rag__query` tool.

    from pydantic_ai import Agent
    from haiku.rag.capabilities.context import create_capability as context

    agent = Agent("openai:gpt-5", capabilities=[context(db_path="my.lancedb")])

Where the RAG capability (`rag.py`) lets the model search, read and cite, this one
does what command-line RAG tools do: before the first model request of a run it
searches the knowledge base for the user prompt and sends the filled RAG template
(`haiku.rag.template`) with that request. Nothing is injected when the search finds
nothing or the prompt is blank. A run without a new prompt answers the pending
question of its history, which gets context unless the history already holds it
(a retried run). The model can search again with `rag__query(query, top_k?)`,
which returns JSON.

How the context is injected, and why: in `before_model_request` of the run's first
step, the filled template is enqueued (`ctx.enqueue`) as a user-channel
`ModelRequest` of its own, marked `metadata={"haiku_rag": "context", ...}` (never
sent to the model). Pydantic AI delivers it into the request being prepared and
appends it to the history; no message already in the history is touched. Because
the model's view and the history are the same bytes, every later request of the
run (after tool calls) and every later run continuing the conversation sends an
identical prefix: the prompt cache holds and nothing the model saw disappears.
Rejected alternatives: rewriting only the outgoing request (`request_context`)
would show the context to one request and silently drop it from the next, which
is a history edit from the model's point of view (it breaks the cached prefix and
preserved thinking); instructions or a `SystemPromptPart` would give retrieved,
untrusted document text operator authority (a prompt injection inside a document
would become load-bearing), and the user-chosen template belongs with the
question anyway.

The tool definition is built once per process and shared by every run, so its
schema is byte-identical between requests. Per run, the capability (a fresh copy
from `for_run`) holds its own read-only client, closed when the run's toolset is
exited, or a borrowed `rag=` client that it never closes. What was injected is
recorded in `ContextState`, in `deps.state["rag_context"]` when the deps carry a
`state` dict.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field
from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelRequest, UserPromptPart
from pydantic_ai.toolsets import FunctionToolset, ToolsetTool

from haiku.rag.capabilities._toolset import RunScopedToolset
from haiku.rag.capabilities.rag import MAX_TOP_K, TOOL_KIND
from haiku.rag.capabilities.state import prompt_text, state_container
from haiku.rag.client import HaikuRAG, resolve_db_path
from haiku.rag.config import AppConfig, load_config
from haiku.rag.documents import Citation, SearchResult
from haiku.rag.template import (
    DEFAULT_TEMPLATE,
    fill_template,
    is_filled,
    source_numbers,
    validate_template,
)

if TYPE_CHECKING:
    from pydantic_ai.capabilities.abstract import ModelRequestContext, WrapRunHandler
    from pydantic_ai.run import AgentRunResult

CONTEXT_KIND = TOOL_KIND
"""Metadata key (the RAG capability's) on the injected request ("context") and on the
tool definition ("rag__query")."""
STATE_KEY = "rag_context"
QUERY_TOOL = "rag__query"

QUERY_DESCRIPTION = (
    "Search the knowledge base (hybrid: semantic + keyword) when the context you were "
    'given is not enough. Returns JSON {"rag_name", "count", "chunks": [{"text", '
    '"source"}]}, best chunk first; "source" is the document uri.'
)


class ContextState(BaseModel):
    """What the capability retrieved in the current run."""

    question: str | None = None
    """The prompt the injected context was retrieved for (None: nothing was searched)."""
    injected: list[SearchResult] = Field(default_factory=list)
    """The chunks sent with the first request, in rank order (empty: nothing injected)."""
    queries: dict[str, list[SearchResult]] = Field(default_factory=dict)
    """`rag__query` calls of the run: query -> results."""

    def citations(self) -> list[Citation]:
        """The injected chunks as citations; `index` is the source number `[n]` the
        template showed, so chunks of one document share it."""
        numbers = source_numbers(self.injected)
        return [Citation.from_result(numbers[r.document_uri], r) for r in self.injected]


def load_context_state(deps: object) -> ContextState | None:
    """`deps.state["rag_context"]`, created or validated back from a dict on demand."""
    container = state_container(deps)
    if container is None:
        return None
    value = container.get(STATE_KEY)
    if not isinstance(value, ContextState):
        value = ContextState() if value is None else ContextState.model_validate(value)
        container[STATE_KEY] = value
    return value


async def _query_signature(
    ctx: RunContext[Any],
    query: str,
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] | None = None,
) -> dict[str, Any]:
    """Search the knowledge base.

    Args:
        query: What to look for; specific terms work best.
        top_k: How many chunks (default: the knowledge base's search.top_k).
    """
    raise NotImplementedError  # schema only: _ContextToolset dispatches to the run's capability


@functools.cache
def _prototype_toolset() -> FunctionToolset[Any]:
    """Built once per process: the same, byte-identical definition for every run."""
    toolset: FunctionToolset[Any] = FunctionToolset(max_retries=3)
    toolset.add_function(
        _query_signature,
        name=QUERY_TOOL,
        description=QUERY_DESCRIPTION,
        metadata={CONTEXT_KIND: QUERY_TOOL},
    )
    return toolset


@dataclass
class _ContextToolset(RunScopedToolset):
    """One run's view of the shared tool; leaving it releases the run's client."""

    owner: ContextCapability | None = None

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        assert self.owner is not None
        return await self.owner.query(ctx, **tool_args)


@dataclass
class ContextCapability(AbstractCapability[Any]):
    """Retrieved context before the first request, plus `rag__query`; see `create_capability`."""

    db_path: Path | str | None = None
    config: AppConfig | None = None
    rag: HaikuRAG | None = None
    """A borrowed, already open client; never closed by the capability."""
    rag_name: str | None = None
    top_k: int | None = None
    """Chunks injected (None: the knowledge base's search.top_k)."""
    template: str | None = None
    filter: str | None = None
    """Restricts injection and `rag__query` to documents whose uri matches (as `search`)."""

    _: KW_ONLY

    id: str | None = "haiku_rag_context"
    description: str | None = "Context retrieved from a knowledge base, and a search tool."

    _client: HaikuRAG | None = field(default=None, init=False, repr=False)
    _fallback: ContextState | None = field(default=None, init=False, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}")
        if self.rag is not None:
            self.config = self.rag.config
            self.db_path = self.rag.location
            self.rag_name = self.rag_name or self.rag.rag_name
        else:
            if self.config is None:
                self.config = load_config()
            named = self.db_path is None and self.rag_name is not None  # opened by name
            url = self.db_path is not None and _is_url(self.db_path)
            if not named and not url:
                self.db_path = resolve_db_path(self.db_path, self.config)
        if self.template is None:
            self.template = self.config.rag_template or DEFAULT_TEMPLATE
        else:
            validate_template(self.template)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a client and a config object; build it with create_capability

    @property
    def name(self) -> str:
        """The knowledge base's name: the one it was opened by, else its store's stem."""
        if self.rag_name:
            return self.rag_name
        return Path(str(self.db_path).rstrip("/")).stem

    def context_state(self, ctx: RunContext[Any]) -> ContextState:
        state = load_context_state(ctx.deps)
        if state is not None:
            return state
        if self._fallback is None:
            self._fallback = ContextState()
        return self._fallback

    # run lifecycle -------------------------------------------------------------------

    async def for_run(self, ctx: RunContext[Any]) -> ContextCapability:
        """A fresh copy per run (its own client slot and fallback state)."""
        return replace(self)

    async def wrap_run(
        self, ctx: RunContext[Any], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        try:
            await self.client()  # a missing store fails before the first model request
            return await handler()
        finally:
            await self.release()

    async def client(self) -> HaikuRAG:
        """The borrowed client, or this run's own read-only one (opened once)."""
        if self.rag is not None:
            return self.rag
        async with self._lock:
            if self._client is None:
                if self.db_path is None:
                    assert self.rag_name is not None
                    kb = HaikuRAG.named(self.rag_name, self.config, read_only=True)
                else:
                    kb = HaikuRAG(self.db_path, self.config, read_only=True)
                self._client = await kb.open()
        return self._client

    async def release(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    # model-facing contributions ------------------------------------------------------

    def get_toolset(self) -> _ContextToolset:
        return _ContextToolset(_prototype_toolset(), owner=self)

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """On the run's first step only: retrieve for the prompt and enqueue the filled
        template, which lands in this request and in the history (see the module doc)."""
        if ctx.run_step != 1:
            return request_context
        question = self._question(ctx.prompt)
        if question is None:
            return request_context
        kb = await self.client()
        results = await kb.search(question, top_k=self.top_k, filter=self.filter)
        state = self.context_state(ctx)
        state.question, state.injected, state.queries = question, results, {}
        if results:
            assert self.template is not None
            text = fill_template(self.template, question, results)
            ctx.enqueue(
                ModelRequest(
                    parts=[UserPromptPart(text)],
                    metadata={
                        CONTEXT_KIND: "context",
                        "rag_name": self.name,
                        "chunk_ids": [result.chunk_id for result in results],
                    },
                )
            )
        return request_context

    def _question(self, prompt: str | Sequence[Any] | None) -> str | None:
        """The text to retrieve for, or None: a blank prompt, or a run resuming a request
        that already carries filled-in context (Pydantic AI then gives the request's user
        parts as the prompt: the question, then the context)."""
        assert self.template is not None
        if prompt is not None and not isinstance(prompt, str):
            texts = [item for item in prompt if isinstance(item, str)]
            if any(is_filled(self.template, text) for text in texts[1:]):
                return None
        question = prompt_text(prompt)
        return question if question and question.strip() else None

    # the tool ------------------------------------------------------------------------

    async def query(
        self, ctx: RunContext[Any], query: str, top_k: int | None = None
    ) -> dict[str, Any]:
        """`rag__query`: the client's hybrid search (vector, BM25, graph and reranker as
        configured), with the knowledge base's top_k unless the model asks for another."""
        kb = await self.client()
        results = await kb.search(query, top_k=top_k, filter=self.filter)
        self.context_state(ctx).queries[query] = results
        return {
            "rag_name": self.name,
            "count": len(results),
            "chunks": [
                {"text": result.content, "source": result.document_uri} for result in results
            ],
        }


def _is_url(location: str | Path) -> bool:
    return isinstance(location, str) and "://" in location


def create_capability(
    db_path: str | Path | None = None,
    config: AppConfig | None = None,
    *,
    rag: HaikuRAG | None = None,
    rag_name: str | None = None,
    top_k: int | None = None,
    template: str | None = None,
    filter: str | None = None,
) -> ContextCapability:
    """The context capability for `Agent(model, capabilities=[...])`.

    Args:
        db_path: The knowledge base; default: the named one (`rag_name`), else
            `HAIKU_RAG_DB`, else the config's data dir.
        config: Settings (embeddings, search, `rag_template`); default: the config file.
        rag: An open `HaikuRAG` to use instead of opening one; the caller closes it.
        rag_name: A named knowledge base (in the rags dir, opened by `HaikuRAG.named`
            when neither `db_path` nor `rag` is given); also the `rag_name` that
            `rag__query` reports (default: the client's name, else the store's stem).
        top_k: Chunks injected before the first request (default: the knowledge base's
            `search.top_k`). `rag__query` defaults to the knowledge base's too.
        template: The RAG template (default: `rag_template` from the config, else
            `DEFAULT_TEMPLATE`); must contain `__INPUT__` and `__CONTEXT__`.
        filter: Only documents whose uri matches this glob/substring, for the injected
            context and for `rag__query`.
    """
    if rag is not None and db_path is not None:
        raise ValueError("pass either db_path or rag=, not both")
    return ContextCapability(
        db_path=db_path,
        config=config,
        rag=rag,
        rag_name=rag_name,
        top_k=top_k,
        template=template,
        filter=filter,
    )
