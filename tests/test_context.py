"""The context capability: injected context before the first request, and `rag__query`."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from typer.testing import CliRunner

from haiku.rag.capabilities.context import (
    QUERY_TOOL,
    STATE_KEY,
    ContextCapability,
    ContextState,
    create_capability,
    load_context_state,
)
from haiku.rag.capabilities.state import RAGDeps
from haiku.rag.cli import app
from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig, config_from_dict
from haiku.rag.errors import StoreNotFoundError
from haiku.rag.template import TemplateError

QUESTION = "What do operators wear?"


async def build(path: Path, config: AppConfig) -> None:
    async with HaikuRAG(path, config, create=True) as kb:
        await kb.add_text(
            "Operators wear a hard hat and steel boots.", uri="mem://safety", title="Safety"
        )
        await kb.add_text("Hard wheat makes good pasta.", uri="mem://pasta", title="Pasta")
        await kb.add_text("Forklifts need a licence.", uri="mem://forklift")


@pytest.fixture
def kb_path(tmp_path: Path, config: AppConfig) -> Path:
    path = tmp_path / "plant.lancedb"
    asyncio.run(build(path, config))
    return path


def injected(messages: list[ModelMessage]) -> list[ModelRequest]:
    return [
        m
        for m in messages
        if isinstance(m, ModelRequest) and (m.metadata or {}).get("haiku_rag") == "context"
    ]


def user_texts(message: ModelMessage) -> list[str]:
    return [p.content for p in message.parts if isinstance(p, UserPromptPart)]  # type: ignore[misc]


def flat(messages: list[ModelMessage]) -> list[tuple[str, Any]]:
    """What the model is sent, part by part, without timestamps, ids or metadata."""
    return [
        (part.part_kind, getattr(part, "content", None) or getattr(part, "args", None))
        for message in messages
        for part in message.parts
    ]


def contexts_seen(messages: list[ModelMessage]) -> list[str]:
    """Injected context as the model received it (consecutive requests arrive merged, and
    metadata is never sent): user parts that are not a plain question."""
    return [
        text
        for message in messages
        for text in (user_texts(message) if isinstance(message, ModelRequest) else [])
        if isinstance(text, str)
        and ("Question:" in text or "=>" in text or text.startswith("CTX<"))
    ]


class Script:
    """A FunctionModel that records what each request carried and follows a plan."""

    def __init__(self, *steps: ModelResponse) -> None:
        self.steps = list(steps)
        self.requests: list[list[ModelMessage]] = []
        self.tools: list[list[Any]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(list(messages))
        self.tools.append(info.function_tools)
        if self.steps:
            return self.steps.pop(0)
        return ModelResponse(parts=[TextPart("Hard hat [1].")])

    @property
    def model(self) -> FunctionModel:
        return FunctionModel(self)


async def test_context_is_injected_before_the_first_request_only(kb_path: Path, config: AppConfig):
    script = Script(ModelResponse(parts=[ToolCallPart(QUERY_TOOL, {"query": "boots"})]))
    capability = create_capability(kb_path, config, top_k=2)
    agent = Agent(script.model, capabilities=[capability], deps_type=RAGDeps)
    deps = RAGDeps()
    result = await agent.run(QUESTION, deps=deps)
    assert result.output == "Hard hat [1]."

    first = script.requests[0]
    [text] = contexts_seen(first)
    assert user_texts(first[0]) == [QUESTION, text]  # the prompt as it was, then the context
    assert "[1] Safety — mem://safety\nOperators wear a hard hat" in text
    assert text.count("\n[") >= 2 and "mem://forklift" not in text  # top_k=2
    assert text.rstrip().endswith(f"Question: {QUESTION}")

    # the history keeps it as its own request, marked; the second request (after the
    # tool call) carries the same single injection
    [context] = injected(result.all_messages())
    assert user_texts(context) == [text]
    assert context.metadata is not None and context.metadata["rag_name"] == "plant"
    assert context.metadata["chunk_ids"] == [r.chunk_id for r in deps.state[STATE_KEY].injected]
    assert contexts_seen(script.requests[1]) == [text]

    state = deps.state[STATE_KEY]
    assert isinstance(state, ContextState)
    assert state.question == QUESTION and len(state.injected) == 2
    assert [c.index for c in state.citations()] == [1, 2]
    assert list(state.queries) == ["boots"]
    assert capability._client is None  # the original is never used by a run


async def test_rag_query_returns_the_json_shape(kb_path: Path, config: AppConfig):
    small = config.model_copy(update={"search": config.search.model_copy(update={"top_k": 2})})
    script = Script(
        ModelResponse(
            parts=[
                ToolCallPart(QUERY_TOOL, {"query": "hard hat"}, tool_call_id="a"),
                ToolCallPart(QUERY_TOOL, {"query": "pasta", "top_k": 1}, tool_call_id="b"),
            ]
        )
    )
    agent = Agent(script.model, capabilities=[create_capability(kb_path, small)])
    await agent.run(QUESTION)
    returns = {
        part.tool_call_id: part.content
        for part in script.requests[1][-1].parts
        if isinstance(part, ToolReturnPart)
    }
    default, one = returns["a"], returns["b"]
    assert set(default) == {"rag_name", "count", "chunks"}
    assert default["rag_name"] == "plant"
    assert default["count"] == len(default["chunks"]) == 2  # the KB's search.top_k
    assert default["chunks"][0] == {
        "text": "Operators wear a hard hat and steel boots.",
        "source": "mem://safety",
    }
    assert one["count"] == 1 and one["chunks"][0]["source"] == "mem://pasta"

    [tool] = script.tools[0]
    assert tool.name == QUERY_TOOL
    assert tool.parameters_json_schema["required"] == ["query"]
    assert tool.parameters_json_schema["properties"]["top_k"]["anyOf"][0]["maximum"] == 20


async def test_tool_definition_is_identical_across_runs(kb_path: Path, config: AppConfig):
    script = Script()
    for _ in range(2):
        agent = Agent(script.model, capabilities=[create_capability(kb_path, config)])
        await agent.run(QUESTION)
    assert script.tools[0] == script.tools[1]
    assert create_capability(kb_path, config).get_toolset().wrapped is (
        create_capability(kb_path, config).get_toolset().wrapped
    )


async def test_nothing_is_injected_when_nothing_is_found(tmp_path: Path, config: AppConfig):
    empty = tmp_path / "empty.yaml"
    async with HaikuRAG(empty, config, create=True):
        pass
    script = Script()
    deps = RAGDeps()
    agent = Agent(script.model, capabilities=[create_capability(empty, config)], deps_type=RAGDeps)
    await agent.run(QUESTION, deps=deps)
    [request] = script.requests[0]
    assert user_texts(request) == [QUESTION]
    assert load_context_state(deps) == ContextState(question=QUESTION)


async def test_filter_and_blank_prompts(kb_path: Path, config: AppConfig):
    script = Script()
    capability = create_capability(kb_path, config, filter="nothing-matches")
    await Agent(script.model, capabilities=[capability]).run(QUESTION)
    assert contexts_seen(script.requests[-1]) == []

    # the filter holds for rag__query too
    script = Script(ModelResponse(parts=[ToolCallPart(QUERY_TOOL, {"query": "hard"})]))
    capability = create_capability(kb_path, config, filter="pasta")
    await Agent(script.model, capabilities=[capability]).run(QUESTION)
    [text] = contexts_seen(script.requests[0])
    assert "mem://pasta" in text and "mem://safety" not in text
    [tool_return] = [p for p in script.requests[1][-1].parts if isinstance(p, ToolReturnPart)]
    assert [c["source"] for c in tool_return.content["chunks"]] == ["mem://pasta"]

    # a blank prompt injects nothing
    agent = Agent(script.model, capabilities=[create_capability(kb_path, config)])
    await agent.run("   ")
    assert contexts_seen(script.requests[-1]) == []

    # a run without a prompt answers the pending question of its history: it gets context
    # once, and not again when the history already carries it (a retried run)
    pending = await agent.run(None, message_history=[ModelRequest([UserPromptPart(QUESTION)])])
    assert len(contexts_seen(script.requests[-1])) == 1
    retried = [m for m in pending.all_messages() if isinstance(m, ModelRequest)]
    await agent.run(None, message_history=retried)
    assert len(contexts_seen(script.requests[-1])) == 1


async def test_history_is_appended_to_never_rewritten(kb_path: Path, config: AppConfig):
    async with HaikuRAG(kb_path, config, read_only=True) as kb:
        script = Script()
        agent = Agent(script.model, capabilities=[create_capability(rag=kb)])
        first = await agent.run(QUESTION)
        history = first.all_messages()
        snapshot = copy.deepcopy(history)

        second = await agent.run("What makes good pasta?", message_history=history)
        assert history == snapshot  # the list passed in is untouched
        # the model's view of the first turn is byte-identical in the second (the cached
        # prefix holds); Pydantic AI may merge consecutive requests, which changes nothing sent
        assert flat(script.requests[-1])[: len(flat(snapshot))] == flat(snapshot)
        assert flat(second.all_messages())[: len(flat(snapshot))] == flat(snapshot)
        contexts = contexts_seen(script.requests[-1])
        assert len(contexts) == 2
        assert contexts[1].rstrip().endswith("Question: What makes good pasta?")
        assert kb._store is not None  # a borrowed client stays open


async def test_templates_from_config_and_argument(kb_path: Path, config: AppConfig):
    custom = config.model_copy(update={"rag_template": "CTX<__CONTEXT__> Q<__INPUT__>"})
    script = Script()
    await Agent(script.model, capabilities=[create_capability(kb_path, custom)]).run(QUESTION)
    [text] = contexts_seen(script.requests[-1])
    assert text.startswith("CTX<[1] Safety — mem://safety")

    own = create_capability(kb_path, custom, template="__INPUT__ => __CONTEXT__ (__SOURCES__)")
    await Agent(script.model, capabilities=[own]).run(QUESTION)
    [text] = contexts_seen(script.requests[-1])
    assert text.startswith(f"{QUESTION} => [1] Safety")

    with pytest.raises(TemplateError, match="__CONTEXT__"):
        create_capability(kb_path, config, template="__INPUT__ only")


async def test_names_arguments_and_a_missing_store(
    tmp_path: Path, kb_path: Path, config: AppConfig
):
    assert create_capability(kb_path, config, rag_name="plant-docs").name == "plant-docs"
    assert create_capability("qdrant://host:6333/manuals", config).name == "manuals"
    assert create_capability(kb_path, config).name == "plant"
    with pytest.raises(ValueError, match="top_k"):
        create_capability(kb_path, config, top_k=0)
    async with HaikuRAG(kb_path, config, read_only=True) as kb:
        with pytest.raises(ValueError, match="either"):
            create_capability(kb_path, rag=kb)
        assert create_capability(rag=kb).config is config
    assert ContextCapability.get_serialization_name() is None

    script = Script()
    missing = create_capability(tmp_path / "missing.lancedb", config)
    with pytest.raises(StoreNotFoundError):
        await Agent(script.model, capabilities=[missing]).run(QUESTION)
    assert script.requests == []  # failed before the first model request


async def test_state_without_deps_and_from_a_dict(kb_path: Path, config: AppConfig):
    script = Script()
    capability = create_capability(kb_path, config)
    await Agent(script.model, capabilities=[capability]).run(QUESTION)  # no deps: own state
    deps = RAGDeps(state={STATE_KEY: {"question": "old", "injected": []}})
    state = load_context_state(deps)
    assert isinstance(state, ContextState) and state.question == "old"
    assert load_context_state(object()) is None


async def test_ask_inject_uses_the_context_capability(kb_path: Path, config: AppConfig):
    seen: list[list[ModelMessage]] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(messages)
        assert [t.name for t in info.function_tools] == [QUERY_TOOL]
        return ModelResponse(parts=[TextPart("A hard hat [1].")])

    async with HaikuRAG(kb_path, config, read_only=True) as kb:
        text, citations = await kb.ask(QUESTION, model=FunctionModel(answer), inject=True)
        assert text == "A hard hat [1]."
        assert citations[0].index == 1 and citations[0].document_uri == "mem://safety"
        _, none = await kb.ask(QUESTION, "nothing", model=FunctionModel(answer), inject=True)
        assert none == []
    assert "[1] Safety — mem://safety" in contexts_seen(seen[0])[0]


def test_cli_ask_inject(kb_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    config_file = tmp_path / "haiku.rag.yaml"
    config_file.write_text(yaml.safe_dump({"embeddings": {"model": "hash:v1", "dimension": 256}}))
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(config_file))
    original = HaikuRAG.ask
    calls: list[dict[str, Any]] = []

    async def scripted(self: HaikuRAG, question: str, filter=None, *, model=None, inject=False):
        calls.append({"question": question, "model": model, "inject": inject})
        return await original(self, question, filter, model=Script().model, inject=inject)

    monkeypatch.setattr(HaikuRAG, "ask", scripted)
    runner = CliRunner()
    result = runner.invoke(
        app, ["--db", str(kb_path), "ask", "--inject", "--model", "test", QUESTION]
    )
    assert result.exit_code == 0, result.output
    assert calls == [{"question": QUESTION, "model": "test", "inject": True}]
    lines = result.stdout.splitlines()
    assert lines[0] == "Hard hat [1]."
    assert any(line.startswith("[1] Safety (mem://safety, chunk ") for line in lines)


def test_config_fixture_is_deterministic():
    # the capability resolves its config from the file when none is passed
    config = config_from_dict({"embeddings": {"model": "hash:v1", "dimension": 256}})
    assert create_capability("x.lancedb", config).config is config


async def test_a_named_knowledge_base(
    tmp_path: Path, config: AppConfig, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("HAIKU_RAG_RAGS_DIR", str(tmp_path / "rags"))
    async with HaikuRAG.named("notes", config, create=True, driver="yaml") as kb:
        await kb.add_text("Operators wear a hard hat.", uri="mem://safety", title="Safety")
        assert create_capability(rag=kb).name == "notes"  # a borrowed named client
    script = Script(ModelResponse(parts=[ToolCallPart(QUERY_TOOL, {"query": "hat"})]))
    capability = create_capability(config=config, rag_name="notes")
    assert capability.db_path is None  # resolved when a run opens it
    await Agent(script.model, capabilities=[capability]).run(QUESTION)
    [tool_return] = [p for p in script.requests[1][-1].parts if isinstance(p, ToolReturnPart)]
    assert tool_return.content["rag_name"] == "notes"
    assert tool_return.content["chunks"][0]["source"] == "mem://safety"
    with pytest.raises(StoreNotFoundError, match="missing"):
        await Agent(script.model, capabilities=[create_capability(rag_name="missing")]).run("q")


async def test_config_from_the_environment_and_a_multi_part_prompt(
    kb_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    config_file = tmp_path / "haiku.rag.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "embeddings": {"model": "hash:v1", "dimension": 256},
                "rag_template": "Use: __CONTEXT__\nQuestion: __INPUT__",
            }
        )
    )
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(config_file))
    monkeypatch.setenv("HAIKU_RAG_DB", str(kb_path))
    capability = create_capability()
    assert capability.db_path == kb_path
    script = Script()
    await Agent(script.model, capabilities=[capability]).run(["What do operators", "wear?"])
    [text] = contexts_seen(script.requests[0])
    assert text.startswith("Use: [1] Safety") and text.endswith(
        "Question: What do operators\nwear?"
    )
