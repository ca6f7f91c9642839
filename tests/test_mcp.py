"""The MCP server (`haiku-rag mcp`): tools, errors, read-only mode, stdio and streamable HTTP.

Most tests talk to the server in-process (`mcp.Client(server)`, no framing); the
acceptance tests start `haiku-rag mcp` as a subprocess over stdio and over HTTP on
127.0.0.1, with the MCP client library, against a real LanceDB store built with the
deterministic `hash:v1` embedder.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent
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
from haiku.rag.documents import document_id_for
from haiku.rag.mcp import build_server, serve

READ_TOOLS = {"search", "list_documents", "get_document", "execute_code"}
WRITE_TOOLS = {"add_source", "delete_document"}
CONFIG = {"embeddings": {"model": "hash:v1", "dimension": 256}}


def text(result: CallToolResult) -> str:
    assert result.content and isinstance(result.content[0], TextContent)
    return result.content[0].text


def ok(result: CallToolResult) -> str:
    assert not result.is_error, text(result)
    return text(result)


def error(result: CallToolResult) -> str:
    assert result.is_error, text(result)
    return text(result)


@pytest.fixture
async def kb_path(tmp_path: Path, config: AppConfig, corpus: Path) -> Path:
    path = tmp_path / "kb.lancedb"
    async with HaikuRAG(path, config, create=True) as kb:
        report = await kb.add(str(corpus))
    assert len(report.added) == 5
    return path


@pytest.fixture
async def kb(kb_path: Path, config: AppConfig) -> AsyncIterator[HaikuRAG]:
    async with HaikuRAG(kb_path, config) as client:
        yield client


async def tool_names(client: Client) -> set[str]:
    return {tool.name for tool in (await client.list_tools()).tools}


# tools, in-process -------------------------------------------------------------------


async def test_tools_by_mode(kb_path: Path, config: AppConfig, kb: HaikuRAG) -> None:
    async with Client(build_server(kb)) as client:
        tools = (await client.list_tools()).tools
        assert {t.name for t in tools} == READ_TOOLS | WRITE_TOOLS  # no `ask`: no qa.model
        by_name = {t.name: t for t in tools}
        assert by_name["search"].annotations and by_name["search"].annotations.read_only_hint
        assert by_name["delete_document"].annotations
        assert by_name["delete_document"].annotations.destructive_hint
        assert by_name["search"].output_schema is not None
        assert "fresh interpreter" in (by_name["execute_code"].description or "")
    async with (
        HaikuRAG(kb_path, config, read_only=True) as read_only,
        Client(build_server(read_only, read_only=True)) as client,
    ):
        assert await tool_names(client) == READ_TOOLS


async def test_search(kb: HaikuRAG) -> None:
    async with Client(build_server(kb)) as client:
        result = await client.call_tool("search", {"query": "BM25 full-text search engine"})
        rendered = ok(result)
        assert "tantivy.md" in rendered and "[chunk_id: " in rendered
        data = result.structured_content
        assert data is not None and data["query"] == "BM25 full-text search engine"
        assert data["results"][0]["document_uri"].endswith("tantivy.md")
        assert len(data["results"]) == 5

        narrowed = await client.call_tool(
            "search", {"query": "water", "top_k": 1, "filter": "cooking"}
        )
        assert narrowed.structured_content is not None
        [hit] = narrowed.structured_content["results"]
        assert "/cooking/" in hit["document_uri"]

        nothing = await client.call_tool("search", {"query": "water", "filter": "no-such-dir"})
        assert ok(nothing) == 'No results for "water".'


async def test_search_rejects_bad_arguments(kb: HaikuRAG) -> None:
    async with Client(build_server(kb)) as client:
        message = error(await client.call_tool("search", {"query": "x", "top_k": 500}))
        assert "top_k" in message and "less than or equal to 20" in message


async def test_list_documents_pages(kb: HaikuRAG) -> None:
    async with Client(build_server(kb)) as client:
        first = await client.call_tool("list_documents", {"limit": 2})
        rendered = ok(first)
        assert rendered.startswith("Documents 1-2:") and "offset=2" in rendered
        assert first.structured_content is not None
        assert len(first.structured_content["documents"]) == 2
        assert "content" not in first.structured_content["documents"][0]

        rest = await client.call_tool("list_documents", {"limit": 10, "offset": 2})
        assert ok(rest).startswith("Documents 3-5:") and "offset=" not in ok(rest)
        assert ok(await client.call_tool("list_documents", {"offset": 9})) == (
            "No documents after offset 9."
        )


async def test_list_documents_empty_store(tmp_path: Path, config: AppConfig) -> None:
    async with (
        HaikuRAG(tmp_path / "empty.lancedb", config, create=True) as kb,
        Client(build_server(kb)) as client,
    ):
        assert ok(await client.call_tool("list_documents", {})) == "No documents."


async def test_get_document(kb: HaikuRAG, corpus: Path) -> None:
    async with Client(build_server(kb)) as client:
        uri = (corpus / "tantivy.md").resolve().as_uri()
        by_uri = await client.call_tool("get_document", {"id_or_uri": uri})
        assert "Tantivy is a full-text search engine" in ok(by_uri)
        assert by_uri.structured_content is not None
        assert by_uri.structured_content["id"] == document_id_for(uri)
        by_id = await client.call_tool("get_document", {"id_or_uri": document_id_for(uri)})
        assert ok(by_id) == ok(by_uri)


async def test_get_unknown_document_is_an_error(kb: HaikuRAG) -> None:
    async with Client(build_server(kb)) as client:
        message = error(await client.call_tool("get_document", {"id_or_uri": "nope.md"}))
        assert "No document 'nope.md'" in message and "list_documents" in message


async def test_execute_code_over_documents(kb: HaikuRAG) -> None:
    async with Client(build_server(kb)) as client:
        code = (
            "import os, json\n"
            "ids = sorted(os.listdir('.'))\n"
            "print(len(ids))\n"
            "meta = [json.loads(open(f'{i}/metadata.json').read())['uri'] for i in ids]\n"
            "print(sum(1 for uri in meta if '/cooking/' in uri))\n"
            "hits = await search('Reciprocal Rank Fusion', top_k=1)\n"
            "hits[0]['document_uri'].rsplit('/', 1)[-1]"
        )
        output = ok(await client.call_tool("execute_code", {"code": code}))
        lines = output.splitlines()
        assert lines[:3] == ["5", "2", "'rrf.md'"]
        assert lines[3].startswith("Chunk ids found by search(): ")

        rows = ok(await client.call_tool("execute_code", {"code": "len(await list_documents())"}))
        assert rows == "5"
        assert ok(await client.call_tool("execute_code", {"code": "x = 1"})) == "(no output)"


async def test_execute_code_has_a_fresh_namespace_per_call(kb: HaikuRAG) -> None:
    async with Client(build_server(kb)) as client:
        ok(await client.call_tool("execute_code", {"code": "kept = 41"}))
        message = error(await client.call_tool("execute_code", {"code": "kept + 1"}))
        assert "NameError" in message and "kept" in message


async def test_execute_code_errors_carry_the_traceback(kb: HaikuRAG) -> None:
    async with Client(build_server(kb)) as client:
        message = error(await client.call_tool("execute_code", {"code": "print('before')\n1 / 0"}))
        assert "before" in message and "ZeroDivisionError: division by zero" in message
        denied = error(await client.call_tool("execute_code", {"code": "open('x.txt', 'w')"}))
        assert "read-only" in denied


async def test_write_tools(kb: HaikuRAG, tmp_path: Path) -> None:
    async with Client(build_server(kb)) as client:
        note = tmp_path / "extra" / "note.md"
        note.parent.mkdir()
        note.write_text("# Note\n\nZebras graze on the savanna.\n", encoding="utf-8")
        added = await client.call_tool("add_source", {"source": str(note)})
        assert ok(added).startswith("1 added")
        assert added.structured_content is not None
        assert added.structured_content["added"] == [note.resolve().as_uri()]
        assert added.structured_content["chunks_embedded"] == 1
        again = await client.call_tool("add_source", {"source": str(note)})
        assert ok(again).startswith("0 added, 0 updated, 1 unchanged")

        found = await client.call_tool("search", {"query": "zebras savanna", "top_k": 1})
        assert "note.md" in ok(found)

        assert ok(await client.call_tool("delete_document", {"id_or_uri": str(note)})) == (
            f"Deleted {note}"
        )
        message = error(await client.call_tool("delete_document", {"id_or_uri": str(note)}))
        assert "No document" in message


async def test_add_source_errors(kb: HaikuRAG, tmp_path: Path) -> None:
    async with Client(build_server(kb)) as client:
        missing = error(await client.call_tool("add_source", {"source": str(tmp_path / "gone")}))
        assert "No such file or directory" in missing

        folder = tmp_path / "mixed"
        folder.mkdir()
        (folder / "good.md").write_text("# Good\n\nReadable text.\n", encoding="utf-8")
        (folder / "bad.md").write_bytes(b"\x00\xff\xfe\x00binary\x00")
        partial = error(await client.call_tool("add_source", {"source": str(folder)}))
        assert partial.count("1 added") == 1 and "1 failed" in partial
        assert "bad.md" in partial and "Not a text file" in partial


async def test_read_only_store_refuses_writes_with_a_message(
    kb_path: Path, config: AppConfig
) -> None:
    """Write tools on a store that cannot be written still fail with the store's reason."""
    async with (
        HaikuRAG(kb_path, config, read_only=True) as kb,
        Client(build_server(kb, read_only=False)) as client,
    ):
        message = error(await client.call_tool("delete_document", {"id_or_uri": "x"}))
    assert "opened read-only" in message


async def test_unexpected_failures_keep_their_message(
    kb: HaikuRAG, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Client(build_server(kb)) as client:

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(kb, "search", broken)
        message = error(await client.call_tool("search", {"query": "x"}))
        assert message.endswith("RuntimeError: disk on fire")


def answering_model() -> FunctionModel:
    """Search, cite the first hit, answer: the capability's loop, scripted."""

    def run(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        part = last.parts[0] if isinstance(last, ModelRequest) else None
        if not isinstance(part, ToolReturnPart):
            return ModelResponse(parts=[ToolCallPart("search", {"query": "spaghetti"})])
        if part.tool_name == "search":
            ids = part.metadata["chunk_ids"][:1]
            return ModelResponse(parts=[ToolCallPart("cite", {"chunk_ids": ids})])
        return ModelResponse(parts=[TextPart("Cook it for nine minutes [1].")])

    return FunctionModel(run)


async def test_ask_when_a_qa_model_is_configured(
    kb_path: Path, config: AppConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    config.qa.model = "openai:gpt-5"  # only its presence matters; the model is scripted
    async with HaikuRAG(kb_path, config, read_only=True) as kb:
        original = kb.ask

        async def scripted(question: str) -> Any:
            return await original(question, model=answering_model())

        monkeypatch.setattr(kb, "ask", scripted)
        async with Client(build_server(kb, read_only=True)) as client:
            assert await tool_names(client) == READ_TOOLS | {"ask"}
            result = await client.call_tool("ask", {"question": "How long for spaghetti?"})
            rendered = ok(result)
    assert rendered.startswith("Cook it for nine minutes [1].\n\nSources:\n[1] Pasta")
    assert result.structured_content is not None
    [citation] = result.structured_content["citations"]
    assert citation["document_uri"].endswith("pasta.md")


async def test_ask_without_citations(
    kb_path: Path, config: AppConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    config.qa.model = "openai:gpt-5"
    async with HaikuRAG(kb_path, config, read_only=True) as kb:

        async def uncited(question: str) -> Any:
            return "The documents do not say.", []

        monkeypatch.setattr(kb, "ask", uncited)
        async with Client(build_server(kb, read_only=True)) as client:
            result = await client.call_tool("ask", {"question": "Who won in 1998?"})
    assert ok(result) == "The documents do not say."
    assert result.structured_content == {"answer": "The documents do not say.", "citations": []}


async def test_ask_failure_is_an_error(kb_path: Path, config: AppConfig) -> None:
    config.qa.model = "nonexistent-provider:model"
    async with (
        HaikuRAG(kb_path, config, read_only=True) as kb,
        Client(build_server(kb, read_only=True)) as client,
    ):
        message = error(await client.call_tool("ask", {"question": "anything"}))
    assert "nonexistent-provider" in message


# serve(), in-process over HTTP ---------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_for_http(port: int, timeout: float = 30.0) -> None:
    async with httpx.AsyncClient() as http:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                await http.get(f"http://127.0.0.1:{port}/mcp", timeout=1.0)
                return
            except httpx.TransportError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def test_serve_http_stops_and_closes_on_sigterm(
    kb_path: Path, config: AppConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    kb = HaikuRAG(kb_path, config, read_only=True)
    port = free_port()
    serving = asyncio.create_task(serve(kb, read_only=True, transport="http", port=port))
    try:
        await wait_for_http(port)
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            assert await tool_names(client) == READ_TOOLS
            assert "lancedb.md" in ok(await client.call_tool("search", {"query": "LanceDB"}))
        os.kill(os.getpid(), signal.SIGTERM)  # handled by uvicorn, then by serve()
        await asyncio.wait_for(serving, 30)
    finally:
        serving.cancel()
    assert kb._store is None  # closed
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handler restored
    err = capsys.readouterr().err
    assert f"{kb_path} (5 documents, read-only) on http://127.0.0.1:{port}/mcp" in err
    assert "knowledge base closed" in err


async def test_serve_cancelled_without_sigterm_propagates(
    kb_path: Path, config: AppConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    kb = HaikuRAG(kb_path, config, read_only=True)
    port = free_port()
    serving = asyncio.create_task(serve(kb, transport="http", host="0.0.0.0", port=port))
    await wait_for_http(port)
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving
    assert kb._store is None
    assert "not a loopback address and the server has no auth" in capsys.readouterr().err


# the real thing: subprocesses with the MCP client library ------------------------------


@pytest.fixture
def server_env(kb_path: Path, tmp_path: Path) -> dict[str, str]:
    """What `haiku-rag mcp` needs: the store, the deterministic embedder, an isolated home."""
    config_file = tmp_path / "haiku.rag.yaml"
    config_file.write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    keep = ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "HF_HUB_OFFLINE", "PATH")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env.update(HAIKU_RAG_CONFIG=str(config_file), HAIKU_RAG_DB=str(kb_path))
    return env


def mcp_command(*args: str) -> list[str]:
    return ["-m", "haiku.rag.cli", "mcp", *args]


async def test_stdio_server(server_env: dict[str, str], tmp_path: Path) -> None:
    """Acceptance: list tools, search and execute_code against a real store over stdio."""
    params = StdioServerParameters(command=sys.executable, args=mcp_command(), env=server_env)
    log = tmp_path / "stderr.log"
    with log.open("w") as errlog:
        try:
            async with asyncio.timeout(60):
                async with Client(stdio_client(params, errlog=errlog)) as client:
                    assert await tool_names(client) == READ_TOOLS | WRITE_TOOLS
                    found = await client.call_tool("search", {"query": "IVF_PQ vector indexes"})
                    assert "lancedb.md" in ok(found)
                    code = "import os\nlen(os.listdir('/documents'))"
                    assert ok(await client.call_tool("execute_code", {"code": code})) == "5"
                    failed = error(
                        await client.call_tool("execute_code", {"code": "raise KeyError('k')"})
                    )
                    assert "KeyError" in failed and "raise KeyError('k')" in failed
                    unknown = error(await client.call_tool("get_document", {"id_or_uri": "zz"}))
                    assert "No document 'zz'" in unknown
        except Exception as failure:  # the server's stderr says why it went away
            raise AssertionError(f"server stderr:\n{log.read_text()}") from failure
    logged = log.read_text()
    assert "(5 documents, read-write) on stdio" in logged
    assert "knowledge base closed" in logged  # closed at end of stdin, before exit


async def test_stdio_server_read_only_legacy_handshake(server_env: dict[str, str]) -> None:
    """--read-only has no write tools; an older client's initialize handshake works too."""
    params = StdioServerParameters(
        command=sys.executable, args=mcp_command("--read-only"), env=server_env
    )
    async with asyncio.timeout(60):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert names == READ_TOOLS
            assert not names & WRITE_TOOLS
            result = await session.call_tool("search", {"query": "sourdough starter"})
            assert "bread.txt" in ok(result)


async def test_http_server_subprocess(server_env: dict[str, str]) -> None:
    """`haiku-rag mcp --http` on 127.0.0.1 and a free port; SIGTERM closes it cleanly."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *mcp_command("--read-only", "--http", "--port", str(port)),
        env=server_env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(60):
            await wait_for_http(port)
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                assert await tool_names(client) == READ_TOOLS
                found = await client.call_tool("search", {"query": "BM25", "top_k": 2})
                assert found.structured_content is not None
                assert len(found.structured_content["results"]) == 2
            process.send_signal(signal.SIGTERM)
            stdout, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode()
    assert stdout == b""
    assert b"knowledge base closed" in stderr


def test_cli_without_the_mcp_package(
    server_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in server_env.items():
        monkeypatch.setenv(name, value)
    for name in [name for name in sys.modules if name == "mcp" or name.startswith("mcp.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import mcp...` now fails
    monkeypatch.delitem(sys.modules, "haiku.rag.mcp")
    result = CliRunner().invoke(app, ["mcp"])
    assert result.exit_code == 1
    assert "pip install 'haiku.rag[mcp]'" in result.output


def test_cli_read_only_needs_an_existing_store(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["--db", str(tmp_path / "none.lancedb"), "mcp", "--read-only"])
    assert result.exit_code == 1
    assert not (tmp_path / "none.lancedb").exists()
