"""Sandboxed Python over the documents, for the `execute_code` tool and the MCP server.

Code runs in a Monty worker subprocess (no host filesystem, network, subprocesses
or environment). Documents are served read-only from memory at
`/documents/{document_id}/` (`content.txt`, `metadata.json`, `chunks.jsonl`), the
working directory is `/documents`, and two async host functions are available:
`await search(query, top_k=None)` and `await list_documents()`.

One `Sandbox` is one REPL: variables persist between `run` calls until a call
times out or the interpreter crashes; then the worker is replaced, the next result
says `restarted=True`, and the namespace is empty.

Monty facts this relies on (pydantic-monty 1.4):
- A session keeps its globals across feeds, also after an exception (assignments
  made before the failing line stay) and after a syntax error.
- `ResourceLimits` duration limits do not count time in `time.sleep` or in host
  calls, so the timeout is a host-side wall clock: cancelling `feed_run` kills the
  worker and finishes the checkout; host calls still running are cancelled here.
- A crashed or killed worker raises `MontyCrashedError` once; the checkout is then
  finished and a new one must be taken from the pool (a few milliseconds).
- Filesystem and print callbacks run on Monty's own threads; host functions run as
  asyncio tasks on the caller's loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from types import TracebackType
from typing import Any, Literal, NoReturn, Self

from pydantic_monty import (
    AsyncMonty,
    AsyncMontySession,
    MemoryFile,
    MontyClassProxy,
    MontyCrashedError,
    MontyError,
    MontyFileHandle,
    MontyRuntimeError,
    MontyStdTypeProxy,
    MontySyntaxError,
    OSAccess,
    ResourceLimits,
)

from haiku.rag.config import SandboxConfig
from haiku.rag.documents import Chunk, Document, SearchResult
from haiku.rag.errors import HaikuRAGError

DOCUMENTS_DIR = "/documents"

# Heap cap per interpreter: generous for text work, small enough that a runaway
# allocation fails with MemoryError inside the sandbox instead of swapping the host.
MAX_MEMORY_BYTES = 512 * 1024 * 1024

# Monty counts every host round trip (file reads included) against a per-session
# budget that defaults to 1000 and cannot be disabled; the wall-clock timeout is the
# real bound, so the budget is set out of reach.
MAX_SUSPENSIONS = 1_000_000_000

# Monty 1.4.0's tokio threads may still post a completion to the event loop just
# after the pool exits; if the interpreter is finalizing at that moment the process
# aborts (SIGABRT). Yielding briefly after closing the pool lets those land.
_POOL_SETTLE_SECONDS = 0.005

SearchFn = Callable[[str, int | None], Awaitable[list[SearchResult]]]
"""The host search the sandbox's `search(query, top_k)` calls (query, top_k)."""


class SandboxError(HaikuRAGError):
    """The Monty sandbox could not be started."""


@dataclass(frozen=True)
class MountedDocument:
    """A document and its chunks, as exposed under `/documents/{document.id}/`."""

    document: Document
    chunks: list[Chunk]


@dataclass
class ExecutionResult:
    """What one `run` produced, for the model (output, error) and the host (the rest)."""

    output: str
    """Printed text plus the repr of the last expression (if not None), capped."""
    error: str | None = None
    """The Python error (traceback with line numbers), or None."""
    timed_out: bool = False
    """The call hit `sandbox.code_timeout`; the interpreter was discarded."""
    restarted: bool = False
    """This call ran in a fresh interpreter replacing one lost to a timeout or crash."""
    found: list[SearchResult] = field(default_factory=list)
    """Results returned by `await search(...)` in this call, first occurrence per chunk."""


class _ReadOnlyFS(OSAccess):
    """OSAccess is writable by design; documents are evidence, so every write fails."""

    def __init__(self, files: Sequence[MemoryFile]) -> None:
        super().__init__(files, environ={})
        # /documents must exist (it is the working directory) even with no documents.
        OSAccess.path_mkdir(self, PurePosixPath(DOCUMENTS_DIR), parents=True, exist_ok=True)

    @staticmethod
    def _deny(path: PurePosixPath | MontyFileHandle) -> NoReturn:
        name = path.path if isinstance(path, MontyFileHandle) else str(path)
        raise PermissionError(
            f"[Errno 13] Permission denied: {name!r} (the sandbox filesystem is read-only)"
        )

    def path_open(self, path: PurePosixPath, mode: str) -> MontyFileHandle:
        if MontyFileHandle(str(path), mode).writable:
            self._deny(path)
        return super().path_open(path, mode)

    def path_write_text(self, path: PurePosixPath | MontyFileHandle, data: str) -> int:
        self._deny(path)

    def path_write_bytes(self, path: PurePosixPath | MontyFileHandle, data: bytes) -> int:
        self._deny(path)

    def path_append_text(self, path: PurePosixPath | MontyFileHandle, data: str) -> int:
        self._deny(path)

    def path_append_bytes(self, path: PurePosixPath | MontyFileHandle, data: bytes) -> int:
        self._deny(path)

    def path_mkdir(self, path: PurePosixPath, parents: bool, exist_ok: bool) -> None:
        self._deny(path)

    def path_unlink(self, path: PurePosixPath) -> None:
        self._deny(path)

    def path_rmdir(self, path: PurePosixPath) -> None:
        self._deny(path)

    def path_rename(self, path: PurePosixPath, target: PurePosixPath) -> None:
        self._deny(path)


def _check_documents(documents: Sequence[MountedDocument]) -> None:
    """Ids become directory names and chunks must belong to their document."""
    seen: set[str] = set()
    for mounted in documents:
        doc_id = mounted.document.id
        if not doc_id or doc_id in (".", "..") or "/" in doc_id or "\x00" in doc_id:
            raise ValueError(f"document id {doc_id!r} cannot be used as a directory name")
        if doc_id in seen:
            raise ValueError(f"document {doc_id!r} is mounted twice")
        seen.add(doc_id)
        for chunk in mounted.chunks:
            if chunk.document_id != doc_id:
                raise ValueError(
                    f"chunk {chunk.id!r} belongs to document {chunk.document_id!r}, not {doc_id!r}"
                )


def _document_files(mounted: MountedDocument) -> list[MemoryFile]:
    doc = mounted.document
    base = f"{DOCUMENTS_DIR}/{doc.id}"
    meta = doc.model_dump(mode="json", include={"id", "uri", "title", "metadata", "content_hash"})
    lines = [
        json.dumps(
            {
                "chunk_id": chunk.id,
                "order": chunk.order,
                "start": chunk.start,
                "headings": chunk.headings,
                "content": chunk.content,
            },
            ensure_ascii=False,
        )
        + "\n"
        for chunk in sorted(mounted.chunks, key=lambda c: c.order)
    ]
    return [
        MemoryFile(f"{base}/content.txt", doc.content, permissions=0o444),
        MemoryFile(
            f"{base}/metadata.json",
            json.dumps(meta, ensure_ascii=False, indent=2) + "\n",
            permissions=0o444,
        ),
        MemoryFile(f"{base}/chunks.jsonl", "".join(lines), permissions=0o444),
    ]


def _result_row(result: SearchResult) -> dict[str, Any]:
    """The dict the sandbox sees for a search hit (plain data crosses the boundary)."""
    return {
        "chunk_id": result.chunk_id,
        "document_id": result.document_id,
        "document_uri": result.document_uri,
        "document_title": result.document_title,
        "content": result.content,
        "score": result.score,
        "rank": result.rank,
        "chunk_meta": {"headings": list(result.headings), "order": result.order},
        "picture_refs": [],
    }


def _render_value(value: Any) -> str:
    """Host-side repr of a returned value; proxies get the repr the sandbox would print.

    Objects Monty cannot send to the host (functions, iterators, ranges, compiled
    patterns) arrive as their repr string, so they display quoted.
    """
    if isinstance(value, MontyClassProxy):
        fields = ", ".join(f"{key}={item!r}" for key, item in value.attributes.items())
        return f"{value.name}({fields})"
    if isinstance(value, MontyStdTypeProxy):
        if value.kind == "function":
            return f"<built-in function {value.name}>"
        return f"<class {value.name!r}>"
    if isinstance(value, MontyFileHandle):
        return f"<file {value.path!r} mode={value.mode!r}>"
    try:
        return repr(value)
    except Exception as error:  # e.g. RecursionError on a very deeply nested list
        return f"<{type(value).__name__} that cannot be shown: {type(error).__name__}: {error}>"


def _cap(text: str, limit: int, total: int | None = None) -> str:
    """Keep `limit` characters of `text` and say how many of `total` were dropped."""
    total = len(text) if total is None else total
    if total <= limit:
        return text
    return f"{text[:limit]}\n... [output truncated: {total - limit} more characters]"


class _Call:
    """Per-call state: capped printed output, search hits, and host tasks to cancel."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self._limit = sandbox.config.max_output_chars
        self._parts: list[str] = []
        self._kept = 0
        self.printed = 0
        self.found: dict[str, SearchResult] = {}
        self.tasks: set[asyncio.Task[Any]] = set()

    def on_print(self, stream: Literal["stdout", "stderr"], text: str) -> None:
        self.printed += len(text)
        room = self._limit - self._kept
        if room > 0:
            piece = text[:room]
            self._parts.append(piece)
            self._kept += len(piece)

    def output(self, value: Any) -> str:
        text = "".join(self._parts)
        total = self.printed
        if value is not None:
            sep = "\n" if text and not text.endswith("\n") else ""
            shown = _render_value(value)
            text += sep + shown
            total += len(sep) + len(shown)
        return _cap(text, self._limit, total)

    def _track(self) -> None:
        task = asyncio.current_task()
        assert task is not None, "Monty runs each host call as its own task"
        self.tasks.add(task)

    async def search(self, query: str, top_k: int | None = None) -> list[dict[str, Any]]:
        self._track()
        if not isinstance(query, str):
            raise TypeError(f"search() query must be a str, not {type(query).__name__}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
            raise TypeError(f"search() top_k must be an int or None, not {type(top_k).__name__}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"search() top_k must be at least 1, got {top_k}")
        try:
            results = await self._sandbox.search_fn(query, top_k)
        except Exception as error:
            # Host exception types do not cross the boundary; keep the message.
            raise RuntimeError(f"search failed: {error}") from None
        for result in results:
            self.found.setdefault(result.chunk_id, result)
        return [_result_row(result) for result in results]

    async def list_documents(self) -> list[dict[str, Any]]:
        self._track()
        return self._sandbox.document_rows()

    def cancel_pending(self) -> None:
        """Monty leaves host calls running when a feed is cancelled; stop them."""
        for task in self.tasks:
            if not task.done():
                task.cancel()


class Sandbox:
    """A persistent Monty interpreter over mounted documents; start is lazy.

    Use as `async with Sandbox(...) as sandbox:` or call `aclose()`: the worker is a
    subprocess and must be released.
    """

    def __init__(
        self,
        documents: Sequence[MountedDocument],
        search: SearchFn,
        config: SandboxConfig,
    ) -> None:
        _check_documents(documents)
        self.documents: list[MountedDocument] = list(documents)
        self.search_fn = search
        self.config = config
        self._fs = _ReadOnlyFS([f for mounted in self.documents for f in _document_files(mounted)])
        self._lock = asyncio.Lock()
        self._stack: AsyncExitStack | None = None
        self._pool: AsyncMonty | None = None
        self._session: AsyncMontySession | None = None
        self._session_fed = False
        self._lost = False
        self._closed = False

    def document_rows(self) -> list[dict[str, Any]]:
        """What `await list_documents()` returns inside the sandbox."""
        return [
            mounted.document.model_dump(mode="json", include={"id", "uri", "title", "metadata"})
            for mounted in self.documents
        ]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _open_session(self) -> AsyncMontySession:
        """Spawn the pool on first use and check out a fresh interpreter."""
        try:
            if self._pool is None:
                self._stack = AsyncExitStack()
                self._pool = await self._stack.enter_async_context(
                    AsyncMonty(min_processes=1, max_processes=1)
                )
            limits: ResourceLimits = {
                "max_memory": MAX_MEMORY_BYTES,
                "max_suspensions": MAX_SUSPENSIONS,
            }
            session = self._pool.checkout(script_name="main.py", limits=limits)
            await session.__aenter__()
        except (RuntimeError, OSError, MontyError) as error:
            raise SandboxError(
                f"Cannot start the Monty sandbox: {error}. Reinstall pydantic-monty (its "
                "pydantic-monty-runtime part ships the `monty` worker) or set MONTY_BIN."
            ) from error
        self._session = session
        self._session_fed = False
        return session

    async def _drop_session(self) -> None:
        """Release the interpreter; a cancelled or crashed checkout is already dead."""
        session, self._session = self._session, None
        if session is not None:
            with suppress(RuntimeError, MontyError):
                await session.__aexit__(None, None, None)

    async def run(self, code: str) -> ExecutionResult:
        """Run `code` in the persistent namespace; errors are returned, not raised."""
        async with self._lock:
            if self._closed:
                raise RuntimeError("this Sandbox is closed; create a new one")
            restarted = False
            session = self._session
            if session is None:
                session = await self._open_session()
                restarted, self._lost = self._lost, False
            call = _Call(self)
            value: Any = None
            error: str | None = None
            timed_out = False
            cwd = None if self._session_fed else DOCUMENTS_DIR
            self._session_fed = True
            try:
                async with asyncio.timeout(self.config.code_timeout):
                    value = await session.feed_run(
                        code,
                        external_lookup={
                            "search": call.search,
                            "list_documents": call.list_documents,
                        },
                        os=self._fs,
                        cwd=cwd,
                        print_callback=call.on_print,
                    )
            except TimeoutError:
                timed_out = True
                error = (
                    f"Execution stopped after {self.config.code_timeout:g} s "
                    "(sandbox.code_timeout); variables from earlier calls are gone."
                )
                await self._lose_session()
            except MontyCrashedError as crash:
                error = (
                    f"The sandbox interpreter crashed ({crash}); variables from earlier "
                    "calls are gone. The next call starts a fresh interpreter."
                )
                await self._lose_session()
            except (MontyRuntimeError, MontySyntaxError) as failure:
                error = failure.display("traceback")
            except MontyError as failure:  # pragma: no cover - conversion/typing: not reachable
                # Unknown state after an unexpected Monty failure: do not reuse the session.
                error = f"{type(failure).__name__}: {failure}; earlier variables are gone."
                await self._lose_session()
            except asyncio.CancelledError:
                await self._lose_session()
                raise
            finally:
                call.cancel_pending()
            return ExecutionResult(
                output=call.output(value),
                error=None if error is None else _cap(error, self.config.max_output_chars),
                timed_out=timed_out,
                restarted=restarted,
                found=list(call.found.values()),
            )

    async def _lose_session(self) -> None:
        await self._drop_session()
        self._lost = True

    async def aclose(self) -> None:
        """Stop the worker and the pool; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        async with self._lock:
            await self._drop_session()
            stack, self._stack, self._pool = self._stack, None, None
            if stack is not None:
                await stack.aclose()
                await asyncio.sleep(_POOL_SETTLE_SECONDS)


async def run_once(
    documents: Sequence[MountedDocument],
    search: SearchFn,
    config: SandboxConfig,
    code: str,
) -> ExecutionResult:
    """Run `code` in a fresh interpreter and release it (one MCP call, no shared state)."""
    async with Sandbox(documents, search, config) as sandbox:
        return await sandbox.run(code)
