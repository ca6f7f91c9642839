"""`HaikuRAG.ask` and `haiku-rag ask`: the capability in one call."""

from __future__ import annotations

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
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from typer.testing import CliRunner

from haiku.rag.cli import app
from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig
from haiku.rag.errors import ConfigError, HaikuRAGError


def answering_model(query: str = "hard hat") -> FunctionModel:
    """Search, cite the first hit, answer."""

    def run(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        part = last.parts[0] if isinstance(last, ModelRequest) else None
        if not isinstance(part, ToolReturnPart):
            return ModelResponse(parts=[ToolCallPart("search", {"query": query})])
        if part.tool_name == "search":
            ids = part.metadata["chunk_ids"][:1]
            return ModelResponse(parts=[ToolCallPart("cite", {"chunk_ids": ids})])
        return ModelResponse(parts=[TextPart("Wear a hard hat [1].")])

    return FunctionModel(run)


async def build(path: Path, config: AppConfig) -> None:
    async with HaikuRAG(path, config, create=True) as kb:
        await kb.add_text("Operators wear a hard hat.", uri="mem://manuals/safety", title="Safety")
        await kb.add_text("Hard wheat makes pasta.", uri="mem://cooking/pasta", title="Pasta")


async def test_ask_returns_answer_and_citations(tmp_path: Path, config: AppConfig):
    path = tmp_path / "kb.lancedb"
    await build(path, config)
    async with HaikuRAG(path, config, read_only=True) as kb:
        answer, citations = await kb.ask("What do operators wear?", model=answering_model())
        assert answer == "Wear a hard hat [1]."
        assert [c.index for c in citations] == [1]
        assert citations[0].document_uri == "mem://manuals/safety"
        assert kb._store is not None  # the borrowed client stays open

        _, only_cooking = await kb.ask("hard?", filter="cooking", model=answering_model("hard"))
        assert only_cooking[0].document_uri == "mem://cooking/pasta"


async def test_ask_needs_a_model(tmp_path: Path, config: AppConfig):
    path = tmp_path / "kb.lancedb"
    await build(path, config)
    async with HaikuRAG(path, config, read_only=True) as kb:
        with pytest.raises(ConfigError, match=r"qa\.model"):
            await kb.ask("anything")
    with pytest.raises(HaikuRAGError, match="not open"):
        await HaikuRAG(path, config).ask("anything", model=answering_model())


def test_cli_ask_prints_answer_and_numbered_sources(
    tmp_path: Path, config: AppConfig, monkeypatch: pytest.MonkeyPatch
):
    import asyncio

    path = tmp_path / "kb.lancedb"
    asyncio.run(build(path, config))
    config_file = tmp_path / "haiku.rag.yaml"
    config_file.write_text(yaml.safe_dump({"embeddings": {"model": "hash:v1", "dimension": 256}}))
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(config_file))
    monkeypatch.setenv("HAIKU_RAG_DB", str(path))
    runner = CliRunner()

    missing = runner.invoke(app, ["ask", "What do operators wear?"])
    assert missing.exit_code == 1 and "qa.model" in missing.output

    original = HaikuRAG.ask
    seen: dict[str, Any] = {}

    async def with_test_model(self: HaikuRAG, question: str, filter=None, *, model=None):
        seen["model"] = model
        return await original(self, question, filter=filter, model=answering_model())

    monkeypatch.setattr(HaikuRAG, "ask", with_test_model)
    result = runner.invoke(app, ["ask", "What do operators wear?", "--model", "test"])
    assert result.exit_code == 0, result.output
    assert seen["model"] == "test"
    lines = result.stdout.splitlines()
    assert lines[0] == "Wear a hard hat [1]."
    assert "Sources:" in lines
    assert any(line.startswith("[1] Safety (mem://manuals/safety, chunk ") for line in lines), lines
