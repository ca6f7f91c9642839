"""Evidence compaction: earlier questions keep only the evidence that was cited.

    agent = Agent(model, capabilities=[rag(db_path=...), compaction.create_capability()])

Search results and code output are large and, once a question is answered, only
the chunks the answer cited still matter. Before each model request this
capability rewrites the outgoing messages (the request only, never the stored
history): every `search` / `execute_code` return of an earlier question is
replaced by that question's cited evidence, taken from the `cite` returns'
metadata in the same messages, so it works with or without `deps.state` and on
deserialised histories.

Prompt cache: the rewrite of a question is a pure function of its own messages,
so once a question is over its compacted form is identical on every later
request; the cached prefix breaks once per new question, not per request.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart

from haiku.rag.capabilities.state import prompt_text

if TYPE_CHECKING:
    from pydantic_ai.models import ModelRequestContext

TOOL_KIND = "haiku_rag"  # same key as rag.TOOL_KIND (not imported: this module stays light)
COMPACTED_KINDS = frozenset({"search", "execute_code"})
DEFAULT_TOOL_NAMES = frozenset({"search", "execute_code"})
CONTENT_CHARS = 1200
"""Cited chunk text kept per citation in a compacted return."""


def _kind(part: ToolReturnPart) -> str | None:
    metadata = part.metadata
    return metadata.get(TOOL_KIND) if isinstance(metadata, dict) else None


def _question(message: ModelMessage) -> str | None:
    if isinstance(message, ModelRequest):
        for part in message.parts:
            if isinstance(part, UserPromptPart):
                return prompt_text(part.content) or ""
    return None


def _segments(messages: Sequence[ModelMessage]) -> list[tuple[str | None, int, int]]:
    """(question, start, end) spans; a request carrying a user prompt opens a new one."""
    spans: list[tuple[str | None, int, int]] = []
    question: str | None = None
    start = 0
    for index, message in enumerate(messages):
        asked = _question(message)
        if asked is not None:
            if index > start:
                spans.append((question, start, index))
            question, start = asked, index
    spans.append((question, start, len(messages)))
    return spans


def _citations(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    """The citations registered in these messages, each once, latest text wins."""
    found: dict[str, dict[str, Any]] = {}
    for message in messages:
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if isinstance(part, ToolReturnPart) and _kind(part) == "cite":
                for citation in part.metadata.get("citations") or []:
                    found[str(citation.get("chunk_id"))] = citation
    return list(found.values())


def render_evidence(question: str | None, citations: list[dict[str, Any]]) -> str:
    label = f' ("{question}")' if question else ""
    if not citations:
        return (
            f"[Compacted: results retrieved for an earlier question{label}; none of them "
            "were cited.]"
        )
    lines = [f"[Compacted: results retrieved for an earlier question{label}. Cited evidence:"]
    for citation in citations:
        source = citation.get("document_title") or citation.get("document_uri")
        content = str(citation.get("content", "")).strip()
        if len(content) > CONTENT_CHARS:
            content = content[:CONTENT_CHARS] + " ..."
        lines.append(f"[{citation.get('index')}] {source} (chunk {citation.get('chunk_id')}):")
        lines.append(content)
    lines.append("]")
    return "\n".join(lines)


POINTER = "[Compacted: results retrieved for an earlier question; its cited evidence is above.]"


def compact_messages(
    messages: Sequence[ModelMessage], tool_names: Collection[str] = DEFAULT_TOOL_NAMES
) -> list[ModelMessage]:
    """A copy of `messages` with earlier questions' retrievals replaced by their citations.

    Parts are identified by the metadata our tools attach, or by `tool_names` (failed
    calls carry no metadata). Changed messages are new objects; the input is untouched.
    """
    result = list(messages)
    spans = _segments(messages)
    current = spans[-1][0]
    for question, start, end in spans[:-1]:
        if question is None or question == current:
            continue
        evidence = render_evidence(question, _citations(messages[start:end]))
        first = True
        for index in range(start, end):
            message = messages[index]
            if not isinstance(message, ModelRequest):
                continue
            parts = list(message.parts)
            changed = False
            for position, part in enumerate(parts):
                if type(part) is not ToolReturnPart:  # not tool-search/load-capability returns
                    continue
                kind = _kind(part)
                if kind in COMPACTED_KINDS or (kind is None and part.tool_name in tool_names):
                    plain = cast("ToolReturnPart[Any]", part)
                    parts[position] = replace(plain, content=evidence if first else POINTER)
                    first = False
                    changed = True
            if changed:
                result[index] = replace(message, parts=parts)
    return result


@dataclass
class EvidenceCompaction(AbstractCapability[Any]):
    """Rewrites each outgoing request so earlier questions carry only their cited evidence."""

    tool_names: frozenset[str] = field(default=DEFAULT_TOOL_NAMES)
    """Names of the retrieval tools (change them if you prefix the RAG capability's tools)."""

    _: KW_ONLY

    id: str | None = "haiku_rag_compaction"

    async def prepare_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        # Request-only: request_context.messages is this attempt's list, not the history.
        request_context.messages = compact_messages(request_context.messages, self.tool_names)
        return request_context


def create_capability(tool_names: Collection[str] = DEFAULT_TOOL_NAMES) -> EvidenceCompaction:
    """The compaction companion of the RAG capability."""
    return EvidenceCompaction(tool_names=frozenset(tool_names))
