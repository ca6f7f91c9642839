"""`haiku-rag chat`: the loop, scripted (no TTY): commands, history, `%%`, `.exit rag`."""

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

from haiku.rag import chat as chat_module
from haiku.rag.chat import (
    LAST_REPLY_URI,
    Chat,
    enable_history,
    open_kb,
    parse_file_command,
    run_chat,
    scripted,
)
from haiku.rag.cli import app
from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig
from haiku.rag.errors import ConfigError, StoreNotFoundError


def last_prompt(messages: list[ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    raise AssertionError("no user prompt")


class Bot:
    """Searches and cites when it has the RAG tools; otherwise echoes the question."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[ModelMessage]]] = []
        self.search_results: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        tools = [tool.name for tool in info.function_tools]
        self.calls.append((tools, messages))
        question = last_prompt(messages)
        if question == "fail":
            raise RuntimeError("the model is down")
        if "search" not in tools:
            return ModelResponse(parts=[TextPart(f"plain: {question}")])
        last = messages[-1]
        part = last.parts[0] if isinstance(last, ModelRequest) else None
        if not isinstance(part, ToolReturnPart):
            return ModelResponse(parts=[ToolCallPart("search", {"query": question})])
        if part.tool_name == "search":
            self.search_results.append(part.content)
            ids = part.metadata["chunk_ids"][:1]
            return ModelResponse(parts=[ToolCallPart("cite", {"chunk_ids": ids})])
        return ModelResponse(parts=[TextPart(f"rag: {question} [1]")])

    @property
    def model(self) -> FunctionModel:
        return FunctionModel(self)


async def build(path: Path, config: AppConfig, text: str, uri: str, title: str) -> None:
    async with HaikuRAG(path, config, create=True) as kb:
        await kb.add_text(text, uri=uri, title=title)


@pytest.fixture
def plant(tmp_path: Path, config: AppConfig) -> Path:
    path = tmp_path / "plant.lancedb"
    asyncio.run(build(path, config, "Operators wear a hard hat.", "mem://safety", "Safety"))
    return path


async def run(lines: list[str], config: AppConfig, **kwargs: Any) -> tuple[Chat, list[str]]:
    output: list[str] = []
    chat = await run_chat(scripted(lines), output.append, config=config, **kwargs)
    return chat, output


async def test_questions_keep_history_and_show_sources(plant: Path, config: AppConfig):
    bot = Bot()
    chat, output = await run(
        ["What do operators wear?", "", "And why?"], config, model=bot.model, db=plant
    )
    assert output[0] == f"Using knowledge base plant ({plant})."
    assert "rag: What do operators wear? [1]" in output
    assert any(line.startswith("[1] Safety (mem://safety, chunk ") for line in output)
    assert output[-1].startswith("[1] Safety")  # citation numbers stay per conversation
    # the second question's requests carry the first turn
    second = [messages for _, messages in bot.calls if last_prompt(messages) == "And why?"]
    assert "What do operators wear?" in [
        p.content for m in second[0] for p in m.parts if isinstance(p, UserPromptPart)
    ]
    assert chat.last_reply == "rag: And why? [1]"
    assert chat.kb is None  # closed at the end
    assert chat.prompt == "> "


async def test_file_command_last_reply_and_exit_rag(tmp_path: Path, plant: Path, config: AppConfig):
    doc = tmp_path / "menu.md"
    doc.write_text("# Menu\n\nThe canteen serves pasta on Fridays.\n")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("When is pasta served?\n")
    bot = Bot()
    chat, output = await run(
        [
            "What do operators wear?",
            f".file {doc} -- When is pasta served?",
            ".file %% -- What did you just say?",
            f'.file "{prompt}"',
            ".exit rag",
            "Hello",
            ".exit rag",
            ".exit",
            "never read",
        ],
        config,
        model=bot.model,
        db=plant,
    )
    assert "rag: When is pasta served? [1]" in output
    assert any(line.startswith(f"[1] Menu ({doc.as_uri()}") for line in output)
    # %% is the last reply, searchable as a document of its own
    assert any(line.startswith(f"[1] Last reply ({LAST_REPLY_URI}") for line in output)
    assert "rag: When is pasta served? [1]" in bot.search_results[2]
    # a single file without `--` is the question, asked of the knowledge base
    assert output.count("rag: When is pasta served? [1]") == 2
    assert "Left plant: plain chat (.rag NAME to use a knowledge base again)." in output
    assert "plain: Hello" in output
    assert "Not using a knowledge base." in output
    assert "never read" not in str(bot.calls[-1][1])
    assert chat.history  # the conversation went on across modes


async def test_switching_knowledge_bases(
    tmp_path: Path, plant: Path, config: AppConfig, monkeypatch: pytest.MonkeyPatch
):
    rags = tmp_path / "rags"
    monkeypatch.setenv("HAIKU_RAG_RAGS_DIR", str(rags))
    async with HaikuRAG.named("kitchen", config, create=True, driver="yaml") as kb:
        await kb.add_text("The oven runs at 250 degrees.", uri="mem://oven", title="Oven")
    bot = Bot()
    _, output = await run(
        [".rag", ".rag kitchen", ".rag", "How hot is the oven?", f".rag {plant}", ".rag nope"],
        config,
        model=bot.model,
    )
    assert "Knowledge base: none (plain chat). Switch with .rag NAME" in output
    assert f"Using knowledge base kitchen ({rags / 'kitchen.yaml'})." in output
    assert f"Knowledge base: kitchen ({rags / 'kitchen.yaml'}). Switch with .rag NAME" in output
    assert any(line.startswith("[1] Oven (mem://oven") for line in output)
    assert f"Using knowledge base plant ({plant})." in output
    assert any(line.startswith("Error: No knowledge base named 'nope'") for line in output)
    assert output[0].startswith("No knowledge base at ")  # no default store: plain chat


async def test_starting_by_name(tmp_path: Path, config: AppConfig, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HAIKU_RAG_RAGS_DIR", str(tmp_path / "rags"))
    async with HaikuRAG.named("notes", config, create=True, driver="yaml") as kb:
        await kb.add_text("Notes.", uri="mem://notes")
    _, output = await run([], config, model=Bot().model, rag_name="notes")
    assert output[0].startswith("Using knowledge base notes (")
    with pytest.raises(StoreNotFoundError):
        await run([], config, model=Bot().model, rag_name="missing")


async def test_messages_and_errors_keep_the_loop_going(plant: Path, config: AppConfig):
    bot = Bot()
    _, output = await run(
        [
            ".help",
            ".bogus",
            ".exit now",
            ".file",
            ".file a.md b.md",
            ".file a.md --",
            ".file %% -- what?",
            ".file missing.md -- what?",
            "fail",
            "...",
        ],
        config,
        model=bot.model,
        db=plant,
    )
    assert any(line.startswith("Commands:") for line in output)
    assert "Unknown command .bogus: .help lists the commands" in output
    assert any(line.startswith("Unknown command .exit now") for line in output)
    assert "Usage: .file DOC [DOC ...] -- QUESTION (.help for more)" in output
    assert "Several documents need a question: .file DOC DOC -- QUESTION" in output
    assert "No question after `--`: .file DOC ... -- QUESTION" in output
    assert "Error: %% is the last reply, and there is none yet" in output
    assert any(line.startswith("Error: ") and "missing.md" in line for line in output)
    assert "Error: RuntimeError: the model is down" in output
    assert "rag: ... [1]" in output  # a line of dots is a question, not a command


async def test_start_needs_a_model_and_an_existing_given_store(tmp_path: Path, config: AppConfig):
    with pytest.raises(ConfigError, match=r"qa\.model"):
        await run([], config)
    with pytest.raises(StoreNotFoundError):
        await run([], config, model=Bot().model, db=tmp_path / "missing.lancedb")


def test_parse_file_command():
    assert parse_file_command('a.md "my notes.md" `git diff HEAD` %% -- what -- changed? ') == (
        ["a.md", "my notes.md", "`git diff HEAD`", "%%"],
        "what -- changed?",
    )
    assert parse_file_command("one.md") == (["one.md"], None)
    assert parse_file_command("'x y.md' --") == (["x y.md"], "")


def test_open_kb_by_path_or_name(
    tmp_path: Path, config: AppConfig, monkeypatch: pytest.MonkeyPatch
):
    assert open_kb("kb.lancedb", config).path == Path("kb.lancedb")
    assert open_kb(str(tmp_path / "x"), config).path == tmp_path / "x"
    assert open_kb("qdrant://localhost:6333/docs", config).location == (
        "qdrant://localhost:6333/docs"
    )
    monkeypatch.setenv("HAIKU_RAG_RAGS_DIR", str(tmp_path / "rags"))
    with pytest.raises(StoreNotFoundError, match="notes"):
        open_kb("notes", config)


def test_readline_history(tmp_path: Path):
    import readline

    path = tmp_path / "data" / "chat_history"
    save = enable_history(path)
    assert save is not None
    readline.clear_history()
    readline.add_history("What do operators wear?")
    save()
    readline.clear_history()
    enable_history(path)
    assert readline.get_history_item(readline.get_current_history_length()) == (
        "What do operators wear?"
    )


def test_cli_chat(plant: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    config_file = tmp_path / "haiku.rag.yaml"
    data = tmp_path / "data"
    config_file.write_text(
        yaml.safe_dump(
            {
                "embeddings": {"model": "hash:v1", "dimension": 256},
                "storage": {"data_dir": str(data)},
            }
        )
    )
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(config_file))
    original = chat_module.run_chat
    seen: dict[str, Any] = {}

    async def with_bot(read: Any, write: Any, **kwargs: Any) -> Chat:
        seen.update(kwargs)
        kwargs["model"] = Bot().model
        return await original(read, write, **kwargs)

    monkeypatch.setattr(chat_module, "run_chat", with_bot)
    result = CliRunner().invoke(
        app,
        ["--db", str(plant), "chat", "--model", "test"],
        input="What do operators wear?\n.exit\n",
    )
    assert result.exit_code == 0, result.output
    assert "rag: What do operators wear? [1]" in result.stdout
    assert seen["model"] == "test" and seen["db"] == plant and seen["rag_name"] is None
    assert (data / "chat_history").exists()

    monkeypatch.setattr(chat_module, "run_chat", original)
    missing = CliRunner().invoke(app, ["chat"], input="")
    assert missing.exit_code == 1 and "qa.model" in missing.output


async def test_file_command_runs_typed_commands_and_reports_failures(
    tmp_path: Path, plant: Path, config: AppConfig
):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "hours.md").write_text("# Hours\n\nThe canteen closes at 3.\n")
    (docs / "blob.md").write_bytes(b"\x00binary")
    bot = Bot()
    _, output = await run(
        [
            ".file `echo The gate opens at 6.` -- When does the gate open?",
            f".file {docs}/*.md -- When does the canteen close?",
            ".file %%",
        ],
        config,
        model=bot.model,
        db=plant,
    )
    gate = "echo The gate opens at 6."
    assert any(line.startswith(f"[1] {gate} (cmd:{gate}, chunk ") for line in output)
    assert "The gate opens at 6." in bot.search_results[0]
    assert any(line.startswith("failed ") and "blob.md" in line for line in output)
    assert any(line.startswith(f"[1] Hours ({(docs / 'hours.md').as_uri()}") for line in output)
    # `.file %%` alone asks the last reply again, of the knowledge base
    assert output.count("rag: rag: When does the canteen close? [1] [1]") == 1
