"""The MCP server: a knowledge base as tools for other agents and editors (`haiku-rag mcp`).

Built on the `mcp` SDK's `MCPServer` (install `haiku.rag[mcp]`). One process serves one
knowledge base, opened once at start (read-only with `--read-only`) and closed on
shutdown: at the end of stdin (stdio), on SIGTERM or on Ctrl+C.

Tools: `search`, `list_documents`, `get_document`, `execute_code` (one program per call
in a fresh Monty sandbox, `haiku.rag.sandbox.run_once`, over the same documents the
capability mounts), `ask` when `qa.model` is configured, and the write tools
`add_source` and `delete_document` unless read-only.

Errors follow the SDK's convention for failures a tool anticipates: a `ToolError`,
which the client receives as a result with `isError: true` and the message as text
(never an empty result). Unexpected exceptions are turned into the same kind of error
with their type and message, and logged with the traceback on stderr; stdout belongs
to the protocol in stdio mode, so nothing here prints to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from haiku.rag.errors import ConfigError, HaikuRAGError

try:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import CallToolResult, TextContent, ToolAnnotations
except ModuleNotFoundError as error:
    raise ConfigError(
        f"The MCP server needs the `mcp` package ({error}): install it with "
        "`pip install 'haiku.rag[mcp]'`"
    ) from None

from haiku.rag.capabilities.rag import MAX_TOP_K, mount_documents, render_results
from haiku.rag.client import HaikuRAG, is_url
from haiku.rag.documents import Citation, Document, SearchResult
from haiku.rag.sandbox import run_once

logger = logging.getLogger("haiku.rag.mcp")

Transport = Literal["stdio", "http"]
DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 500
READ = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

INSTRUCTIONS = (
    "Tools over a haiku.rag knowledge base. `search` first (hybrid semantic + keyword; each "
    "result has a chunk_id); `get_document` reads a whole document; `execute_code` runs "
    "Python over every document (mounted at /documents/<document_id>/) to count, compare or "
    "scan. Quote the document uri and chunk_id of what your answer rests on."
)
SEARCH_DESCRIPTION = (
    "Hybrid (semantic + BM25 keyword) search over the knowledge base. Returns the best "
    "chunks with chunk_id, rank, document uri/title, section headings and text."
)
LIST_DESCRIPTION = "List stored documents (id, title, uri), a page at a time."
GET_DESCRIPTION = "Read one stored document in full, by document id, uri or file path."
EXECUTE_CODE_DESCRIPTION = (
    "Run one Python program in a sandbox over the documents (no network, no writes, no "
    "host filesystem). Each document is mounted read-only at /documents/<document_id>/ "
    "(content.txt, metadata.json, chunks.jsonl with one chunk per line); /documents is the "
    "working directory. Inside, `await search(query, top_k=None)` returns result rows and "
    "`await list_documents()` returns document rows. Every call starts in a fresh "
    "interpreter: variables do not persist between calls. Returns what the program printed "
    "plus the value of its last expression."
)
ASK_DESCRIPTION = (
    "Answer a question from the knowledge base with the server's own chat model "
    "(qa.model), returning the answer and its numbered citations."
)
ADD_DESCRIPTION = (
    "Add or update documents from a source: a file, directory, glob ('docs/**/*.md'), "
    "http(s) URL, or a configured loader ('pdf:report.pdf'). Paths are resolved on the "
    "server, relative to its working directory. Only new or changed documents are embedded."
)
DELETE_DESCRIPTION = "Delete a stored document and its chunks, by document id, uri or file path."


# outputs (structured content; the text content is written for a model to read) ----------


class SearchOutput(BaseModel):
    query: str
    results: list[SearchResult]


class DocumentSummary(BaseModel):
    id: str
    uri: str
    title: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    updated_at: datetime


class DocumentList(BaseModel):
    documents: list[DocumentSummary]
    offset: int
    limit: int


class AskOutput(BaseModel):
    answer: str
    citations: list[Citation]


class AddOutput(BaseModel):
    added: list[str]
    updated: list[str]
    unchanged: list[str]
    deleted: list[str]
    chunks_embedded: int


def _result(text: str, structured: BaseModel) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=structured.model_dump(mode="json"),
    )


@contextlib.contextmanager
def _tool_errors() -> Iterator[None]:
    """Every failure reaches the client as an error result carrying its message."""
    try:
        yield
    except HaikuRAGError as error:
        raise ToolError(str(error)) from error
    except Exception as error:
        logger.exception("haiku.rag MCP tool failed")
        raise ToolError(f"{type(error).__name__}: {error}") from error


def _no_document(id_or_uri: str) -> ToolError:
    return ToolError(
        f"No document {id_or_uri!r} in the knowledge base: use list_documents or search "
        "to find its id or uri"
    )


def build_server(kb: HaikuRAG, *, read_only: bool = False) -> MCPServer:
    """The MCP server over an open client; tools close over `kb` (no per-call opening)."""
    server: MCPServer = MCPServer(
        "haiku.rag",
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        warn_on_duplicate_tools=False,
    )

    async def search(
        query: Annotated[str, Field(description="What to look for; specific terms work best.")],
        top_k: Annotated[
            int | None,
            Field(ge=1, le=MAX_TOP_K, description="How many results (default: search.top_k)."),
        ] = None,
        filter: Annotated[
            str | None,
            Field(description="Only documents whose uri matches this glob or contains it."),
        ] = None,
    ) -> Annotated[CallToolResult, SearchOutput]:
        with _tool_errors():
            results = await kb.search(query, top_k=top_k, filter=filter)
        return _result(render_results(query, results), SearchOutput(query=query, results=results))

    async def list_documents(
        limit: Annotated[int, Field(ge=1, le=MAX_LIST_LIMIT)] = DEFAULT_LIST_LIMIT,
        offset: Annotated[int, Field(ge=0)] = 0,
    ) -> Annotated[CallToolResult, DocumentList]:
        with _tool_errors():
            documents = await kb.list_documents(limit=limit, offset=offset)
        summaries = [DocumentSummary.model_validate(doc, from_attributes=True) for doc in documents]
        if not summaries:
            text = "No documents." if offset == 0 else f"No documents after offset {offset}."
        else:
            lines = [f"Documents {offset + 1}-{offset + len(summaries)}:"]
            lines += [f"- {d.id} | {d.title or '(untitled)'} | {d.uri}" for d in summaries]
            if len(summaries) == limit:
                lines.append(f"More may follow: call again with offset={offset + limit}.")
            text = "\n".join(lines)
        return _result(text, DocumentList(documents=summaries, offset=offset, limit=limit))

    async def get_document(
        id_or_uri: Annotated[str, Field(description="Document id, uri or file path.")],
    ) -> Annotated[CallToolResult, Document]:
        with _tool_errors():
            document = await kb.get_document(id_or_uri)
        if document is None:
            raise _no_document(id_or_uri)
        header = f"# {document.title or document.uri}\nuri: {document.uri}\nid: {document.id}\n\n"
        return _result(header + document.content, document)

    async def execute_code(
        code: Annotated[
            str,
            Field(
                description="Python source; top-level `await` works; the last expression is shown."
            ),
        ],
    ) -> str:
        with _tool_errors():
            documents = await mount_documents(kb, None)

            async def sandbox_search(query: str, top_k: int | None) -> list[SearchResult]:
                return await kb.search(query, top_k=top_k)

            result = await run_once(documents, sandbox_search, kb.config.sandbox, code)
        if result.error is not None:
            raise ToolError("\n".join(part for part in (result.output, result.error) if part))
        parts = [result.output or "(no output)"]
        if result.found:
            parts.append(
                "Chunk ids found by search(): " + ", ".join(hit.chunk_id for hit in result.found)
            )
        return "\n".join(parts)

    for function, description in (
        (search, SEARCH_DESCRIPTION),
        (list_documents, LIST_DESCRIPTION),
        (get_document, GET_DESCRIPTION),
        (execute_code, EXECUTE_CODE_DESCRIPTION),
    ):
        server.add_tool(function, description=description, annotations=READ)

    if kb.config.qa.model is not None:

        async def ask(
            question: Annotated[str, Field(description="The question to answer.")],
        ) -> Annotated[CallToolResult, AskOutput]:
            with _tool_errors():
                answer, citations = await kb.ask(question)
            lines = [answer]
            if citations:
                lines.append("\nSources:")
                lines += [
                    f"[{c.index}] {c.document_title or c.document_uri} "
                    f"({c.document_uri}, chunk {c.chunk_id})"
                    for c in citations
                ]
            return _result("\n".join(lines), AskOutput(answer=answer, citations=citations))

        server.add_tool(
            ask,
            description=ASK_DESCRIPTION,
            annotations=ToolAnnotations(read_only_hint=True, open_world_hint=True),
        )

    if not read_only:

        async def add_source(
            source: Annotated[str, Field(description="Path, glob, URL or 'loader:path'.")],
        ) -> Annotated[CallToolResult, AddOutput]:
            with _tool_errors():
                report = await kb.add(source)
            if report.failed:
                failures = "; ".join(f"{f.uri}: {f.reason}" for f in report.failed)
                raise ToolError(f"{report.summary()}. Failed: {failures}")
            output = AddOutput(
                added=report.added,
                updated=report.updated,
                unchanged=report.unchanged,
                deleted=report.deleted,
                chunks_embedded=report.chunks_embedded,
            )
            return _result(report.summary(), output)

        async def delete_document(
            id_or_uri: Annotated[str, Field(description="Document id, uri or file path.")],
        ) -> str:
            with _tool_errors():
                deleted = await kb.delete_document(id_or_uri)
            if not deleted:
                raise _no_document(id_or_uri)
            return f"Deleted {id_or_uri}"

        server.add_tool(
            add_source,
            description=ADD_DESCRIPTION,
            annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True),
        )
        server.add_tool(
            delete_document,
            description=DELETE_DESCRIPTION,
            annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True),
        )
    return server


def _note(message: str) -> None:
    """Status lines go to stderr: in stdio mode stdout is the protocol channel."""
    print(message, file=sys.stderr, flush=True)


async def serve(
    kb: HaikuRAG,
    *,
    read_only: bool = False,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
) -> None:
    """Open `kb`, serve it until the client goes away or SIGTERM arrives, then close it.

    SIGTERM cancels the serving task, so the store is closed rather than the process
    killed mid-call. With --http, uvicorn handles the signal first (graceful shutdown)
    and then re-raises it, which lands here once serving is already over. The handler
    is a plain `signal.signal` one: asyncio's `add_signal_handler` would also fire while
    uvicorn is still shutting down, since it listens on the wakeup fd.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    terminated = False

    def on_sigterm(signum: int, frame: object) -> None:
        nonlocal terminated
        terminated = True
        loop.call_soon_threadsafe(task.cancel)

    # Signal handlers can only be set from the main thread; elsewhere the caller owns them.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if main_thread else None
    try:
        async with kb:
            server = build_server(kb, read_only=read_only)
            info = await kb.info()
            mode = "read-only" if read_only else "read-write"
            where = "stdio" if transport == "stdio" else f"http://{host}:{port}/mcp"
            location = kb.location if is_url(kb.location) else os.path.abspath(kb.location)
            count = "?" if info.documents is None else info.documents
            _note(f"haiku.rag MCP server: {location} ({count} documents, {mode}) on {where}")
            if transport == "http" and not _is_loopback(host):
                _note(f"warning: {host} is not a loopback address and the server has no auth")
            if transport == "stdio":
                await server.run_stdio_async()
            else:
                await server.run_streamable_http_async(host=host, port=port)
    except asyncio.CancelledError:
        if not terminated:
            raise
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    _note("haiku.rag MCP server stopped; knowledge base closed")


def _is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
