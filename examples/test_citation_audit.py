"""Audit an agent's grounding in a test, with the evidence ledger and `citation_status`.

    pytest examples/test_citation_audit.py

The RAG capability records, question by question, what its tools retrieved and what
the model cited (`RAGState.evidence`). `citation_status(records, question=...)` reads
that ledger: `grounded` (the answer cites chunks retrieved before it), `ungrounded`
(the model declared with `cite([])` that the corpus does not answer the question) or
`missing` (it answered without declaring anything after its last retrieval).

Here scripted `FunctionModel`s play three kinds of model behaviour so the test is
deterministic and offline; to audit your own agent, run it (with its real or a
recorded model) over a small knowledge base and assert on the same ledger. The
`hash:v1` embedder needs no download and always ranks the same way.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from haiku.rag import HaikuRAG
from haiku.rag.capabilities.ledger import citation_status
from haiku.rag.capabilities.rag import create_capability
from haiku.rag.capabilities.state import RAGDeps, RAGState
from haiku.rag.config import config_from_dict

CONFIG = config_from_dict({"embeddings": {"model": "hash:v1", "dimension": 256}})
MANUAL = (
    "# Site safety\n\nEveryone on site wears a hard hat and steel-toed boots.\n\n"
    "## Noise\n\nHearing protection is required near the compressors.\n"
)


def scripted(cite: str) -> FunctionModel:
    """Search the question, then cite the first hit (`first`), nothing (`none`), or skip
    citing altogether (`skip`), then answer."""

    def run(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        part = last.parts[0] if isinstance(last, ModelRequest) else None
        if not isinstance(part, ToolReturnPart):
            return ModelResponse(parts=[ToolCallPart("search", {"query": "hard hat"})])
        if part.tool_name == "search" and cite != "skip":
            ids = part.metadata["chunk_ids"][:1] if cite == "first" else []
            return ModelResponse(parts=[ToolCallPart("cite", {"chunk_ids": ids})])
        return ModelResponse(parts=[TextPart("Wear a hard hat [1].")])

    return FunctionModel(run)


async def run_agent(db: Path, question: str, model: FunctionModel) -> RAGState:
    """Build the knowledge base, ask once, return the capability's state."""
    async with HaikuRAG(db, CONFIG, create=True) as kb:
        await kb.add_text(MANUAL, uri="manuals/safety.md", title="Site safety")
        agent = Agent(model, deps_type=RAGDeps, capabilities=[create_capability(rag=kb)])
        deps = RAGDeps()
        await agent.run(question, deps=deps)
        return deps.state["rag"]


def test_a_cited_answer_is_grounded(tmp_path: Path) -> None:
    question = "What do people wear on site?"
    state = asyncio.run(run_agent(tmp_path / "kb.lancedb", question, scripted("first")))
    assert citation_status(state.evidence, question=question) == "grounded"
    [citation] = state.cited()
    assert citation.document_uri == "manuals/safety.md"
    assert "hard hat" in citation.content


def test_declaring_no_evidence_is_ungrounded(tmp_path: Path) -> None:
    question = "What is the canteen menu?"
    state = asyncio.run(run_agent(tmp_path / "kb.lancedb", question, scripted("none")))
    assert citation_status(state.evidence, question=question) == "ungrounded"
    assert state.cited() == []


def test_an_answer_without_cite_is_missing(tmp_path: Path) -> None:
    question = "What do people wear on site?"
    state = asyncio.run(run_agent(tmp_path / "kb.lancedb", question, scripted("skip")))
    assert citation_status(state.evidence, question=question) == "missing"
    entry = state.current_evidence
    assert entry is not None and entry.retrieved and not entry.cited  # searched, never cited
