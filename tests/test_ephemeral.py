"""Ephemeral RAG: `ask --file DOC ... -- question`, a store that lives for one question."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
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

from haiku.rag import ephemeral
from haiku.rag.cli import app
from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig
from haiku.rag.documents import Document
from haiku.rag.ephemeral import (
    ask_ephemeral,
    ephemeral_kb,
    question_and_sources,
    read_prompt,
)
from haiku.rag.errors import HaikuRAGError, SourceError
from haiku.rag.sources import SourceFailure


def first_user_texts(messages: list[ModelMessage]) -> list[str]:
    request = messages[0]
    assert isinstance(request, ModelRequest)
    return [p.content for p in request.parts if isinstance(p, UserPromptPart)]  # type: ignore[misc]


@pytest.fixture
def docs(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "docs"
    root.mkdir()
    files = {
        "safety": root / "safety.md",
        "pasta": root / "pasta.md",
    }
    files["safety"].write_text("# Safety\n\nOperators wear a hard hat and steel boots.\n")
    files["pasta"].write_text("# Pasta\n\nHard wheat makes good pasta.\n")
    return files


class Checker:
    """A scripted model that checks the context injected in the request it receives."""

    def __init__(self, *expected: str, answer: str = "A hard hat [1].") -> None:
        self.expected = expected
        self.answer = answer
        self.seen: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(messages)
        texts = first_user_texts(messages)
        assert len(texts) == 2, texts  # the question, then the filled template
        for needle in self.expected:
            assert needle in texts[1], (needle, texts[1])
        return ModelResponse(parts=[TextPart(self.answer)])

    @property
    def model(self) -> FunctionModel:
        return FunctionModel(self)


async def test_ask_ephemeral_injects_context_from_files_and_a_command(
    docs: dict[str, Path], config: AppConfig
):
    checker = Checker(
        "# Safety\n\nOperators wear a hard hat",
        docs["safety"].as_uri(),
        "The gate code is 4711.",
        "cmd:echo 'The gate code is 4711.'",
        "Question: What do operators wear?",
    )
    answer, citations = await ask_ephemeral(
        [str(docs["safety"]), str(docs["pasta"]), "`echo 'The gate code is 4711.'`"],
        "What do operators wear?",
        config,
        model=checker.model,
        inject=True,
        allow_commands=True,
    )
    assert answer == "A hard hat [1]."
    assert {c.document_uri for c in citations} == {
        docs["safety"].as_uri(),
        docs["pasta"].as_uri(),
        "cmd:echo 'The gate code is 4711.'",
    }
    assert [c.index for c in citations] == sorted(c.index for c in citations)


async def test_commands_need_to_be_allowed(docs: dict[str, Path], config: AppConfig):
    with pytest.raises(SourceError, match="allow_commands"):
        await ask_ephemeral(["`echo hi`"], "q", config, model=Checker().model)


async def test_ask_ephemeral_with_the_rag_capability_cites_and_discards(
    docs: dict[str, Path], config: AppConfig, monkeypatch: pytest.MonkeyPatch
):
    stores: list[HaikuRAG] = []
    original = HaikuRAG.ask

    async def spy(self: HaikuRAG, *args: Any, **kwargs: Any) -> Any:
        stores.append(self)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(HaikuRAG, "ask", spy)

    def run(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        part = last.parts[0] if isinstance(last, ModelRequest) else None
        if not isinstance(part, ToolReturnPart):
            assert len(first_user_texts(messages)) == 1  # nothing injected
            return ModelResponse(parts=[ToolCallPart("search", {"query": "hard hat"})])
        if part.tool_name == "search":
            ids = part.metadata["chunk_ids"][:1]
            return ModelResponse(parts=[ToolCallPart("cite", {"chunk_ids": ids})])
        return ModelResponse(parts=[TextPart("Wear a hard hat [1].")])

    answer, citations = await ask_ephemeral(
        [str(docs["safety"].parent)], "What do operators wear?", config, model=FunctionModel(run)
    )
    assert answer == "Wear a hard hat [1]."
    assert [(c.index, c.document_uri) for c in citations] == [(1, docs["safety"].as_uri())]
    [kb] = stores
    assert kb.driver == "yaml" and kb.path.name == "ephemeral.yaml"
    assert not kb.path.parent.exists()  # the temporary directory is gone
    assert kb._store is None


async def test_documents_and_failures(tmp_path: Path, docs: dict[str, Path], config: AppConfig):
    last = Document.from_text("The previous answer: 42.", uri="chat:last-reply", title="Last")
    (docs["safety"].parent / "blob.md").write_bytes(b"\x00\x01binary")
    failures: list[SourceFailure] = []
    async with ephemeral_kb(
        [str(docs["safety"].parent / "*.md")],
        config,
        documents=[last],
        on_failure=failures.append,
    ) as kb:
        uris = sorted((await asyncio.to_thread(kb.store.document_hashes)).keys())
        assert uris == sorted([docs["safety"].as_uri(), docs["pasta"].as_uri(), last.uri])
        hits = await kb.search("previous answer", top_k=1)
        assert hits[0].document_uri == "chat:last-reply"
    assert [f.uri.rsplit("/", 1)[-1] for f in failures] == ["blob.md"]

    async with ephemeral_kb(documents=[last], config=config) as only:
        assert await asyncio.to_thread(only.store.count_documents) == 1
        assert only.config is config

    with pytest.raises(SourceError, match="at least one source"):
        async with ephemeral_kb([], config):
            pass  # pragma: no cover
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "only.md").write_bytes(b"\x00")
    with pytest.raises(SourceError, match="No document could be loaded"):
        async with ephemeral_kb([str(empty / "*.md")], config):
            pass  # pragma: no cover


async def test_question_and_sources(tmp_path: Path, config: AppConfig):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("  What do operators wear?\n")
    assert await question_and_sources(["what", "is", "this"], ["a.md", "b.md"]) == (
        "what is this",
        ["a.md", "b.md"],
    )
    assert await question_and_sources(["q"], []) == ("q", [])
    assert await question_and_sources([], [str(prompt)], config) == (
        "What do operators wear?",
        [],
    )
    assert await question_and_sources(
        [" "], ["`echo from a command`"], config, allow_commands=True
    ) == ("from a command", [])
    with pytest.raises(HaikuRAGError, match="after `--`"):
        await question_and_sources([], ["a.md", "b.md"])
    with pytest.raises(HaikuRAGError, match="No question"):
        await question_and_sources([], [])
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n")
    with pytest.raises(SourceError, match="empty"):
        await read_prompt(str(blank))


@pytest.fixture
def cli_env(tmp_path: Path, config: AppConfig, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The CLI with the deterministic embedder, and `HaikuRAG.ask` answering with a
    scripted model that records the question, the store and the injected context."""
    config_file = tmp_path / "haiku.rag.yaml"
    config_file.write_text(yaml.safe_dump({"embeddings": {"model": "hash:v1", "dimension": 256}}))
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(config_file))
    calls: list[dict[str, Any]] = []
    original = HaikuRAG.ask

    async def scripted(self: HaikuRAG, question: str, filter=None, *, model=None, inject=False):
        seen: list[list[ModelMessage]] = []

        def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            seen.append(messages)
            return ModelResponse(parts=[TextPart("Scripted answer.")])

        result = await original(self, question, filter, model=FunctionModel(answer), inject=inject)
        calls.append(
            {
                "question": question,
                "store": self.location,
                "inject": inject,
                "model": model,
                "texts": first_user_texts(seen[0]),
            }
        )
        return result

    monkeypatch.setattr(HaikuRAG, "ask", scripted)
    return calls


def test_cli_ask_file_double_dash_question(docs: dict[str, Path], cli_env: list[dict]):
    result = CliRunner().invoke(
        app,
        [
            "ask",
            "--file",
            str(docs["safety"]),
            "--file",
            "`echo Visitors sign in at the gate.`",
            "--inject",
            "--model",
            "test",
            "--",
            "What",
            "do",
            "--operators",
            "wear?",
        ],
    )
    assert result.exit_code == 0, result.output
    [call] = cli_env
    assert call["question"] == "What do --operators wear?"
    assert call["inject"] is True and call["model"] == "test"
    assert call["store"].endswith("ephemeral.yaml")
    context = call["texts"][1]
    assert "Operators wear a hard hat" in context and "Visitors sign in" in context
    lines = result.stdout.splitlines()
    assert lines[0] == "Scripted answer."
    assert any(line.startswith(f"[1] Safety ({docs['safety'].as_uri()}") for line in lines)


def test_cli_single_file_is_the_prompt(
    tmp_path: Path, config: AppConfig, cli_env: list[dict], monkeypatch: pytest.MonkeyPatch
):
    kb_path = tmp_path / "kb.lancedb"

    async def build() -> None:
        async with HaikuRAG(kb_path, config, create=True) as kb:
            await kb.add_text("Operators wear a hard hat.", uri="mem://safety", title="Safety")

    asyncio.run(build())
    prompt = tmp_path / "question.txt"
    prompt.write_text("What do operators wear?\n")
    result = CliRunner().invoke(
        app, ["--db", str(kb_path), "ask", "--file", str(prompt), "--model", "test"]
    )
    assert result.exit_code == 0, result.output
    [call] = cli_env
    assert call["question"] == "What do operators wear?"
    assert call["store"] == str(kb_path) and call["inject"] is False
    assert call["texts"] == ["What do operators wear?"]  # the RAG capability: nothing injected


def test_cli_usage_errors(docs: dict[str, Path], cli_env: list[dict]):
    runner = CliRunner()
    several = runner.invoke(app, ["ask", "--file", str(docs["safety"]), "--file", "x.md"])
    assert several.exit_code == 1 and "after `--`" in several.output
    nothing = runner.invoke(app, ["ask"])
    assert nothing.exit_code == 1 and "No question" in nothing.output
    missing = runner.invoke(app, ["ask", "--file", "nope.md", "--", "q"])
    assert missing.exit_code == 1 and "nope.md" in missing.output
    assert cli_env == []


def test_cli_reports_items_that_failed(docs: dict[str, Path], cli_env: list[dict]):
    (docs["safety"].parent / "blob.md").write_bytes(b"\x00binary")
    pattern = str(docs["safety"].parent / "*.md")
    result = CliRunner().invoke(app, ["ask", "--file", pattern, "--", "hard hat?"])
    assert result.exit_code == 0, result.output
    assert "failed " in result.stderr and "blob.md" in result.stderr
    assert cli_env[0]["question"] == "hard hat?"


def test_store_choice_is_documented():
    assert ephemeral.DRIVER == "yaml"
    assert "LanceDB" in (ephemeral.__doc__ or "")
