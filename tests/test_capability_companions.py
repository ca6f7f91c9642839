"""The compaction and policy companions of the RAG capability."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryFeedbackPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from haiku.rag.capabilities import compaction, policy
from haiku.rag.capabilities.compaction import POINTER, compact_messages, render_evidence
from haiku.rag.capabilities.ledger import citation_status
from haiku.rag.capabilities.rag import create_capability
from haiku.rag.capabilities.state import RAGDeps
from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig, config_from_dict


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, AppConfig]:
    tmp = tmp_path_factory.mktemp("kb")
    config = config_from_dict(
        {
            "embeddings": {"model": "hash:v1", "dimension": 256},
            "storage": {"data_dir": str(tmp / "data")},
        }
    )
    path = tmp / "kb.lancedb"

    async def build() -> None:
        async with HaikuRAG(path, config, create=True) as kb:
            await kb.add_text("Operators wear hard hats.", uri="mem://safety", title="Safety")
            await kb.add_text("Cook spaghetti nine minutes.", uri="mem://pasta", title="Pasta")

    asyncio.run(build())
    return path, config


def call(tool: str, **args: Any) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool, args)])


def text(content: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content)])


def cite_latest(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart) and part.tool_name == "search":
                    return call("cite", chunk_ids=part.metadata["chunk_ids"][:1])
    raise AssertionError("no search to cite")


class Script:
    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.seen: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        index = len(self.seen) - 1
        step = self.steps[index] if index < len(self.steps) else text("done")
        return step(messages, info) if callable(step) else step


# compaction: the pure rewrite ---------------------------------------------------------------


def _ret(name: str, content: str, metadata: Any = None, call_id: str = "c") -> ToolReturnPart:
    return ToolReturnPart(name, content, tool_call_id=call_id, metadata=metadata)


def conversation() -> list[ModelMessage]:
    citation = {
        "index": 1,
        "chunk_id": "aaaa",
        "document_id": "d",
        "document_uri": "mem://safety",
        "document_title": "Safety",
        "content": "Operators wear hard hats.",
        "headings": [],
    }
    return [
        ModelRequest(parts=[UserPromptPart("Q1")]),
        call("search", query="hats"),
        ModelRequest(parts=[_ret("search", "BIG RESULTS", {"haiku_rag": "search"}, "1")]),
        call("execute_code", code="boom"),
        ModelRequest(parts=[_ret("execute_code", "Traceback ...", None, "2")]),  # failed: no meta
        call("cite", chunk_ids=["aaaa"]),
        ModelRequest(
            parts=[
                _ret("cite", "Registered", {"haiku_rag": "cite", "citations": [citation]}, "3"),
                _ret("weather", "sunny", None, "4"),
            ]
        ),
        text("Hard hats [1]."),
        ModelRequest(parts=[UserPromptPart("Q2")]),
        call("search", query="pasta"),
        ModelRequest(parts=[_ret("search", "CURRENT RESULTS", {"haiku_rag": "search"}, "5")]),
    ]


def test_compaction_replaces_earlier_retrievals_with_cited_evidence():
    messages = conversation()
    frozen = ModelMessagesTypeAdapter.dump_json(messages)
    compacted = compact_messages(messages)
    assert ModelMessagesTypeAdapter.dump_json(messages) == frozen  # input untouched
    first = compacted[2].parts[0]  # type: ignore[union-attr]
    assert isinstance(first, ToolReturnPart) and first.tool_call_id == "1"
    assert first.content.startswith('[Compacted: results retrieved for an earlier question ("Q1")')
    assert "[1] Safety (chunk aaaa):\nOperators wear hard hats." in first.content
    assert compacted[4].parts[0].content == POINTER  # type: ignore[union-attr]
    assert compacted[6] is messages[6]  # cite and other tools' returns are kept as they are
    assert compacted[10] is messages[10]  # the current question is untouched
    assert compacted[10].parts[0].content == "CURRENT RESULTS"  # type: ignore[union-attr]


def test_compaction_keeps_the_same_question_and_says_when_nothing_was_cited():
    messages = conversation()
    same = [*messages[:8], ModelRequest(parts=[UserPromptPart("Q1")])]
    assert compact_messages(same) == same  # a resumed question keeps its evidence
    no_cite = [*messages[:5], text("x"), ModelRequest(parts=[UserPromptPart("Q2")])]
    compacted = compact_messages(no_cite)
    assert "none of them were cited" in compacted[2].parts[0].content  # type: ignore[union-attr]
    assert compact_messages([]) == []
    long = render_evidence(None, [{"index": 1, "chunk_id": "x", "content": "y" * 5000}])
    assert long.endswith(" ...\n]") and "earlier question." in long


async def test_compaction_in_a_run_rewrites_requests_not_history(store):
    path, config = store
    capabilities = [create_capability(path, config), compaction.create_capability()]
    deps = RAGDeps()
    one = Script(call("search", query="hard hats"), cite_latest, text("Hats [1]."))
    first = await Agent(FunctionModel(one), capabilities=capabilities).run("Q1", deps=deps)
    two = Script(call("search", query="spaghetti"), text("Nine minutes."))
    second = await Agent(FunctionModel(two), capabilities=capabilities).run(
        "Q2", deps=deps, message_history=first.all_messages()
    )
    sent = [
        part
        for message in two.seen[1]
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart) and part.tool_name == "search"
    ]
    assert sent[0].content.startswith("[Compacted:") and "Operators wear hard hats." in (
        sent[0].content
    )
    assert sent[1].content.startswith('1 results for "spaghetti"') or "results for" in (
        sent[1].content
    )
    stored = [
        part
        for message in second.all_messages()
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart) and part.tool_name == "search"
    ]
    assert "results for" in stored[0].content  # the history keeps the original content


# policy ------------------------------------------------------------------------------------


async def test_policy_sends_an_uncited_answer_back_once(store):
    path, config = store
    capabilities = [create_capability(path, config), policy.create_capability()]
    script = Script(
        call("search", query="hard hats"), text("Hats."), cite_latest, text("Hats [1].")
    )
    deps = RAGDeps()
    result = await Agent(FunctionModel(script), capabilities=capabilities).run("Q", deps=deps)
    assert result.output == "Hats [1]."
    reminder = script.seen[2][-1].parts[0]  # type: ignore[union-attr]
    assert "call `cite`" in str(reminder.content)  # as the model sees it
    stored = result.all_messages()[4].parts[0]  # type: ignore[union-attr]
    assert isinstance(stored, RetryFeedbackPart)  # the history keeps it apart from user text
    entry = deps.state["rag"].current_evidence
    assert citation_status(deps.state["rag"].evidence) == "grounded"
    assert entry.reminded and entry.violations == []


async def test_policy_records_a_violation_after_the_reminder(store):
    path, config = store
    capabilities = [create_capability(path, config), policy.create_capability()]
    script = Script(call("search", query="hard hats"), text("Hats."), text("Hats, really."))
    deps = RAGDeps()
    result = await Agent(FunctionModel(script), capabilities=capabilities).run("Q", deps=deps)
    assert result.output == "Hats, really."
    entry = deps.state["rag"].current_evidence
    assert entry.violations == [policy.VIOLATION]
    assert citation_status(deps.state["rag"].evidence) == "missing"


async def test_policy_lets_grounded_and_ungrounded_answers_through(store):
    path, config = store
    capabilities = [create_capability(path, config), policy.create_capability()]
    script = Script(call("cite", chunk_ids=[]), text("Not in the documents."))
    deps = RAGDeps()
    await Agent(FunctionModel(script), capabilities=capabilities).run("Q", deps=deps)
    assert len(script.seen) == 2 and not deps.state["rag"].current_evidence.reminded


async def test_policy_without_rag_state_is_a_no_op(store):
    script = Script(text("plain"))
    agent = Agent(FunctionModel(script), capabilities=[policy.create_capability()])
    assert (await agent.run("Q")).output == "plain"
    assert policy.CitationPolicy.get_serialization_name() is None


async def test_policy_works_with_the_capabilitys_own_state(store):
    """No state in deps: the policy finds the RAG capability's per-run state."""
    path, config = store
    capabilities = [create_capability(path, config), policy.create_capability()]
    script = Script(call("search", query="hats"), text("Hats."), cite_latest, text("Hats [1]."))
    result = await Agent(FunctionModel(script), capabilities=capabilities).run("Q")
    assert result.output == "Hats [1]." and len(script.seen) == 4


async def test_compaction_does_not_mistake_retry_feedback_for_a_new_question(store):
    path, config = store
    capabilities = [
        create_capability(path, config),
        policy.create_capability(),
        compaction.create_capability(),
    ]
    script = Script(call("search", query="hard hats"), text("Hats."), cite_latest, text("ok"))
    await Agent(FunctionModel(script), capabilities=capabilities).run("Q", deps=RAGDeps())
    search_return = script.seen[2][2].parts[0]  # type: ignore[union-attr]
    assert isinstance(search_return, ToolReturnPart) and "results for" in search_return.content


async def test_policy_ignores_partial_streamed_output():
    from types import SimpleNamespace

    hook = policy.create_capability().after_output_process
    ctx = SimpleNamespace(partial_output=True)
    assert await hook(ctx, output_context=None, output="part") == "part"  # type: ignore[arg-type]
