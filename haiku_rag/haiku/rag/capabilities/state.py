"""`RAGState`: what the capability remembers about the conversation, kept in `deps.state["rag"]`.

State is a pydantic model so it survives serialisation (a UI or durable store can
keep `deps.state` between requests). When the agent's deps have no `state` dict,
the capability keeps a private `RAGState` per run instead, so nothing depends on
the caller's deps type.

Lifetime rules (applied by the capability at the start of each run):

- `document_filter`, `sources`, `citation_index` and `evidence` persist across runs;
- `citations`, `searches`, `executions` and the per-question budget counters are
  cleared when a new question starts;
- a run that resumes a question (message history whose last user prompt is the
  same question) keeps all of it.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from haiku.rag.capabilities.ledger import CapabilityEvidenceRecord, QuestionEvidence
from haiku.rag.documents import Citation, SearchResult

if TYPE_CHECKING:
    from pydantic_ai import RunContext

STATE_KEY = "rag"


class CodeExecutionEntry(BaseModel):
    """One `execute_code` call, as the model saw it, plus the chunks its searches found."""

    code: str
    output: str
    error: str | None = None
    timed_out: bool = False
    restarted: bool = False
    found_chunk_ids: list[str] = Field(default_factory=list)


class RAGState(BaseModel):
    """The capability's memory; see the module docstring for what persists."""

    citation_index: dict[str, Citation] = Field(default_factory=dict)
    """chunk id -> Citation; its `index` is stable for the whole conversation."""
    citations: list[str] = Field(default_factory=list)
    """Chunk ids cited for the current question, in citation order."""
    document_filter: str | None = None
    """Glob or substring over document uris that every search is restricted to."""
    sources: list[str] | None = None
    """Only these documents (uris, uri globs or document ids), when set."""
    evidence: CapabilityEvidenceRecord = Field(default_factory=CapabilityEvidenceRecord)
    searches: dict[str, list[SearchResult]] = Field(default_factory=dict)
    """query -> results for the current question; code searches are keyed `[code] query`."""
    executions: list[CodeExecutionEntry] = Field(default_factory=list)
    search_calls: int = 0
    """`search` tool calls spent on the current question (checked against qa.max_searches)."""

    @property
    def question(self) -> str | None:
        entry = self.evidence.current()
        return entry.question if entry is not None else None

    @property
    def current_evidence(self) -> QuestionEvidence | None:
        return self.evidence.current()

    def start_question(self, question: str) -> None:
        """Forget the previous question's working set; keep filters, index and ledger."""
        self.citations = []
        self.searches = {}
        self.executions = []
        self.search_calls = 0
        self.evidence.start_question(question)

    def retrieved_results(self) -> dict[str, SearchResult]:
        """Every chunk this question's searches (tool or code) returned, by chunk id."""
        found: dict[str, SearchResult] = {}
        for results in self.searches.values():
            for result in results:
                found.setdefault(result.chunk_id, result)
        return found

    def register_citation(self, result: SearchResult) -> Citation:
        """Cite a chunk: reuse its conversation-wide index, or give it the next one."""
        citation = self.citation_index.get(result.chunk_id)
        if citation is None:
            citation = Citation.from_result(len(self.citation_index) + 1, result)
            self.citation_index[result.chunk_id] = citation
        if result.chunk_id not in self.citations:
            self.citations.append(result.chunk_id)
        return citation

    def cited(self) -> list[Citation]:
        """The current question's citations, in the order they were registered."""
        return [self.citation_index[cid] for cid in self.citations if cid in self.citation_index]


@dataclass
class RAGDeps:
    """Minimal deps that carry a `state` dict, for agents that have no deps of their own."""

    state: dict[str, Any] = field(default_factory=dict)


def state_container(deps: object) -> MutableMapping[str, Any] | None:
    """`deps.state` when it is a mutable mapping, else None (state is then per run)."""
    container = getattr(deps, "state", None)
    return container if isinstance(container, MutableMapping) else None


def load_state(deps: object) -> RAGState | None:
    """The `RAGState` in `deps.state["rag"]`, created (or validated from a dict) on demand.

    A dict or JSON string left by deserialisation is turned back into a `RAGState`
    and stored back, so every hook and tool of a run sees the same object.
    """
    container = state_container(deps)
    if container is None:
        return None
    value = container.get(STATE_KEY)
    if isinstance(value, RAGState):
        return value
    if value is None:
        state = RAGState()
    elif isinstance(value, str | bytes):
        state = RAGState.model_validate_json(value)
    else:
        state = RAGState.model_validate(value)
    container[STATE_KEY] = state
    return state


def find_state(ctx: RunContext[Any]) -> RAGState | None:
    """The state of the RAG capability in this run: deps first, then the capability's own."""
    state = load_state(ctx.deps)
    if state is not None:
        return state
    for capability in ctx.capabilities.values():
        getter = getattr(capability, "rag_state", None)
        if callable(getter):
            found = getter(ctx)
            if isinstance(found, RAGState):
                return found
    return None


def prompt_text(prompt: str | Sequence[Any] | None) -> str | None:
    """The text of a user prompt; non-text content (images...) is left out."""
    if prompt is None:
        return None
    if isinstance(prompt, str):
        return prompt
    texts = [item for item in prompt if isinstance(item, str)]
    return "\n".join(texts)
