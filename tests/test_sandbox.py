"""The Monty sandbox over /documents: real Monty workers, no mocks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator

import pytest

from haiku.rag.config import SandboxConfig
from haiku.rag.documents import Chunk, Document, SearchResult, chunk_id_for
from haiku.rag.sandbox import (
    ExecutionResult,
    MountedDocument,
    Sandbox,
    SandboxError,
    run_once,
)


def _mount(uri: str, title: str, parts: list[str], **metadata: object) -> MountedDocument:
    content = "".join(parts)
    doc = Document.from_text(content, uri=uri, title=title, metadata=dict(metadata))
    chunks, start = [], 0
    for order, part in enumerate(parts):
        chunks.append(
            Chunk(
                id=chunk_id_for(doc.id, order, part),
                document_id=doc.id,
                order=order,
                content=part,
                start=start,
                headings=[title],
            )
        )
        start += len(part)
    # Out of order on purpose: chunks.jsonl is sorted by `order`.
    return MountedDocument(document=doc, chunks=list(reversed(chunks)))


MANUAL = _mount(
    "file:///docs/manual.md",
    "Manual",
    ["# Safety\n\nWear goggles.\n", "Gloves are required near the press.\n"],
    lang="en",
)
RECIPE = _mount("file:///docs/pasta.md", "Pasta", ["Boil water, add spaghetti.\n"])
DOCS = [MANUAL, RECIPE]


class FakeSearch:
    """A host search over the mounted chunks: records calls, may be slow or fail."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.calls: list[tuple[str, int | None]] = []
        self.delay = delay
        self.fail = fail
        self.cancelled = False

    async def __call__(self, query: str, top_k: int | None) -> list[SearchResult]:
        self.calls.append((query, top_k))
        if self.delay:
            try:
                await asyncio.sleep(self.delay)
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        if self.fail:
            raise LookupError("index is offline")
        results: list[SearchResult] = []
        for mounted in DOCS:
            for chunk in sorted(mounted.chunks, key=lambda c: c.order):
                if query.lower() in chunk.content.lower():
                    results.append(
                        SearchResult(
                            chunk_id=chunk.id,
                            document_id=mounted.document.id,
                            document_uri=mounted.document.uri,
                            document_title=mounted.document.title,
                            content=chunk.content,
                            headings=chunk.headings,
                            order=chunk.order,
                            score=1.0 / (len(results) + 1),
                            rank=len(results) + 1,
                        )
                    )
        return results[: top_k or 5]


@pytest.fixture
def search() -> FakeSearch:
    return FakeSearch()


@pytest.fixture
def config() -> SandboxConfig:  # overrides the app-config fixture from conftest
    return SandboxConfig(code_timeout=5.0, max_output_chars=2000)


@pytest.fixture
async def sandbox(search: FakeSearch, config: SandboxConfig) -> AsyncIterator[Sandbox]:
    async with Sandbox(DOCS, search, config) as box:
        yield box


def ok(result: ExecutionResult) -> str:
    assert result.error is None, result.error
    assert not result.timed_out
    return result.output


# -- the filesystem ---------------------------------------------------------------


async def test_reads_content_metadata_and_chunks(sandbox: Sandbox) -> None:
    doc = MANUAL.document
    assert ok(await sandbox.run(f"open('{doc.id}/content.txt').read()")) == repr(doc.content)
    meta = ok(
        await sandbox.run(
            "import json\n"
            f"meta = json.loads(open('/documents/{doc.id}/metadata.json').read())\n"
            "print(json.dumps(meta, sort_keys=True))"
        )
    )
    assert json.loads(meta) == {
        "id": doc.id,
        "uri": doc.uri,
        "title": "Manual",
        "metadata": {"lang": "en"},
        "content_hash": doc.content_hash,
    }
    lines = ok(
        await sandbox.run(
            "from pathlib import Path\n"
            f"for line in Path('{doc.id}/chunks.jsonl').read_text().splitlines():\n"
            "    print(line)"
        )
    ).splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["order"] for r in rows] == [0, 1]
    assert rows[1] == {
        "chunk_id": chunk_id_for(doc.id, 1, "Gloves are required near the press.\n"),
        "order": 1,
        "start": len("# Safety\n\nWear goggles.\n"),
        "headings": ["Manual"],
        "content": "Gloves are required near the press.\n",
    }


async def test_listing_and_working_directory(sandbox: Sandbox) -> None:
    ids = sorted(m.document.id for m in DOCS)
    assert ok(await sandbox.run("import os\nsorted(os.listdir('/documents'))")) == repr(ids)
    assert ok(await sandbox.run("os.getcwd()")) == repr("/documents")
    files = ok(
        await sandbox.run(
            f"from pathlib import Path\nsorted(p.name for p in Path('{ids[0]}').iterdir())"
        )
    )
    assert files == repr(["chunks.jsonl", "content.txt", "metadata.json"])
    # The working directory is set once per interpreter; a chdir persists like in a REPL.
    ok(await sandbox.run(f"os.chdir('{ids[0]}')"))
    assert ok(await sandbox.run("os.getcwd()")) == repr(f"/documents/{ids[0]}")


async def test_no_documents_still_has_documents_dir(
    search: FakeSearch, config: SandboxConfig
) -> None:
    result = await run_once([], search, config, "import os\n(os.getcwd(), os.listdir('.'))")
    assert ok(result) == repr(("/documents", []))


@pytest.mark.parametrize(
    "code",
    [
        "open('new.txt', 'w').write('x')",
        "open('{id}/content.txt', 'a').write('x')",
        "from pathlib import Path\nPath('{id}/content.txt').write_text('x')",
        "from pathlib import Path\nPath('{id}/content.txt').write_bytes(b'x')",
        "from pathlib import Path\nPath('/documents/x').mkdir()",
        "from pathlib import Path\nPath('{id}/content.txt').unlink()",
        "from pathlib import Path\nPath('{id}').rmdir()",
        "from pathlib import Path\nPath('{id}/content.txt').rename('{id}/c.txt')",
        "open('/tmp-file', 'w')",
    ],
)
async def test_writes_fail(sandbox: Sandbox, code: str) -> None:
    doc_id = MANUAL.document.id
    result = await sandbox.run(code.format(id=doc_id))
    assert result.error is not None
    assert "PermissionError" in result.error and "read-only" in result.error
    assert ok(await sandbox.run(f"len(open('{doc_id}/content.txt').read())")) == str(
        len(MANUAL.document.content)
    )


# Monty calls the filesystem and print handlers from its own native threads, which
# coverage cannot trace; these direct calls pin the host side of what the tests
# above check end to end.


def test_filesystem_handlers_refuse_every_write() -> None:
    from pathlib import PurePosixPath

    from pydantic_monty import MontyFileHandle

    from haiku.rag.sandbox import _document_files, _ReadOnlyFS

    fs = _ReadOnlyFS(_document_files(MANUAL))
    path = PurePosixPath(f"/documents/{MANUAL.document.id}/content.txt")
    handle = MontyFileHandle(str(path), "w")
    refused = [
        lambda: fs.path_open(path, "w"),
        lambda: fs.path_open(path, "ab"),
        lambda: fs.path_write_text(handle, "x"),
        lambda: fs.path_write_bytes(path, b"x"),
        lambda: fs.path_append_text(path, "x"),
        lambda: fs.path_append_bytes(handle, b"x"),
        lambda: fs.path_mkdir(path.parent / "new", parents=True, exist_ok=True),
        lambda: fs.path_unlink(path),
        lambda: fs.path_rmdir(path.parent),
        lambda: fs.path_rename(path, path.with_name("moved.txt")),
    ]
    for attempt in refused:
        with pytest.raises(PermissionError, match="read-only"):
            attempt()
    assert fs.path_open(path, "r").mode == "r"
    assert fs.path_read_text(path) == MANUAL.document.content
    assert fs.getenv("HOME") is None


async def test_print_handler_keeps_only_what_can_be_shown(search: FakeSearch) -> None:
    from haiku.rag.sandbox import _Call

    box = Sandbox(DOCS, search, SandboxConfig(code_timeout=5.0, max_output_chars=10))
    call = _Call(box)
    call.on_print("stdout", "12345678")
    call.on_print("stderr", "abcdef")
    call.on_print("stdout", "dropped entirely")
    assert call.printed == 30
    assert call.output(None) == "12345678ab\n... [output truncated: 20 more characters]"
    assert call.output(7) == "12345678ab\n... [output truncated: 22 more characters]"
    await box.aclose()


@pytest.mark.parametrize(
    "code",
    [
        "open('/etc/passwd').read()",
        "open('../etc/passwd').read()",
        "open('/documents/../etc/hosts')",
    ],
)
async def test_reading_outside_documents_fails(sandbox: Sandbox, code: str) -> None:
    result = await sandbox.run(code)
    assert result.error is not None and "FileNotFoundError" in result.error


@pytest.mark.parametrize(
    "code",
    ["import socket", "import subprocess", "import urllib.request", "__import__('os')"],
)
async def test_no_network_or_processes(sandbox: Sandbox, code: str) -> None:
    result = await sandbox.run(code)
    assert result.error is not None
    assert "ModuleNotFoundError" in result.error or "NameError" in result.error


async def test_host_environment_is_hidden(sandbox: Sandbox) -> None:
    assert ok(await sandbox.run("import os\n(os.getenv('HOME'), os.getenv('PATH'))")) == repr(
        (None, None)
    )


# -- REPL semantics -----------------------------------------------------------------


async def test_variables_persist_and_last_value_is_shown(sandbox: Sandbox) -> None:
    assert ok(await sandbox.run("x = 20\ndef double(n):\n    return n * 2")) == ""
    assert ok(await sandbox.run("double(x) + 2")) == "42"
    assert ok(await sandbox.run("'text'")) == "'text'"
    assert ok(await sandbox.run("None")) == ""


async def test_print_is_captured_with_the_value(sandbox: Sandbox) -> None:
    assert ok(await sandbox.run("print('hello')\nprint('no newline', end='')\n1 + 1")) == (
        "hello\nno newline\n2"
    )
    assert ok(await sandbox.run("import sys\nprint('to stderr', file=sys.stderr)")) == (
        "to stderr\n"
    )
    assert ok(await sandbox.run("print('done')\n7")) == "done\n7"


async def test_runtime_error_keeps_the_namespace(sandbox: Sandbox) -> None:
    ok(await sandbox.run("kept = 1"))
    result = await sandbox.run("print('before')\nalso_kept = 2\n1 / 0")
    assert result.output == "before\n"
    assert result.error is not None
    assert "ZeroDivisionError: division by zero" in result.error
    assert "line 3" in result.error
    assert ok(await sandbox.run("kept + also_kept")) == "3"
    missing = await sandbox.run("undefined_name")
    assert missing.error is not None and "NameError" in missing.error
    assert not missing.restarted


async def test_syntax_error_is_reported(sandbox: Sandbox) -> None:
    ok(await sandbox.run("kept = 1"))
    result = await sandbox.run("def broken(:\n    pass")
    assert result.error is not None and "SyntaxError" in result.error
    assert "line 1" in result.error
    assert ok(await sandbox.run("kept")) == "1"


async def test_working_directory_survives_a_failing_first_call(sandbox: Sandbox) -> None:
    assert (await sandbox.run("def broken(:")).error is not None
    assert ok(await sandbox.run("import os\nos.getcwd()")) == repr("/documents")


async def test_values_from_the_sandbox_are_shown_like_python(sandbox: Sandbox) -> None:
    assert ok(
        await sandbox.run("class Point:\n    def __init__(self):\n        self.x = 1\nPoint()")
    ) == ("Point(x=1)")
    assert ok(await sandbox.run("open")) == "<built-in function open>"
    assert ok(await sandbox.run("int")) == "<class 'int'>"
    assert ok(await sandbox.run("import functools\nfunctools.partial")) == (
        "<class 'functools.partial'>"
    )
    doc_id = MANUAL.document.id
    assert ok(await sandbox.run(f"open('{doc_id}/content.txt')")) == (
        f"<file '/documents/{doc_id}/content.txt' mode='r'>"
    )
    assert ok(await sandbox.run("{'a': (1, 2.5, None, True)}")) == "{'a': (1, 2.5, None, True)}"
    deep = ok(await sandbox.run("a = []\nfor _ in range(100000):\n    a = [a]\na"))
    assert deep.startswith("<list that cannot be shown: RecursionError")


# -- host functions ---------------------------------------------------------------------


async def test_search_returns_rows_and_records_found(sandbox: Sandbox, search: FakeSearch) -> None:
    result = await sandbox.run(
        "hits = await search('gloves')\nagain = await search('GLOVES', top_k=1)\nhits[0]"
    )
    row = eval(ok(result))  # the repr of a plain dict
    chunk = next(c for c in MANUAL.chunks if c.order == 1)
    assert row == {
        "chunk_id": chunk.id,
        "document_id": MANUAL.document.id,
        "document_uri": MANUAL.document.uri,
        "document_title": "Manual",
        "content": chunk.content,
        "score": 1.0,
        "rank": 1,
        "chunk_meta": {"headings": ["Manual"], "order": 1},
        "picture_refs": [],
    }
    assert search.calls == [("gloves", None), ("GLOVES", 1)]
    assert [r.chunk_id for r in result.found] == [chunk.id]  # one entry per chunk
    assert isinstance(result.found[0], SearchResult)
    # `found` is per call.
    later = await sandbox.run("len(hits)")
    assert ok(later) == "1" and later.found == []


async def test_search_concurrently_with_gather(sandbox: Sandbox) -> None:
    result = await sandbox.run(
        "import asyncio\n"
        "a, b = await asyncio.gather(search('goggles'), search(query='spaghetti'))\n"
        "[a[0]['document_title'], b[0]['document_title']]"
    )
    assert ok(result) == repr(["Manual", "Pasta"])
    assert len(result.found) == 2


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("await search(3)", "TypeError: search() query must be a str, not int"),
        ("await search('x', top_k='2')", "TypeError: search() top_k must be an int or None"),
        ("await search('x', top_k=True)", "TypeError: search() top_k must be an int or None"),
        ("await search('x', top_k=0)", "ValueError: search() top_k must be at least 1, got 0"),
        ("await search()", "TypeError"),
    ],
)
async def test_search_argument_errors(
    sandbox: Sandbox, search: FakeSearch, code: str, message: str
) -> None:
    result = await sandbox.run(code)
    assert result.error is not None and message in result.error
    assert search.calls == []


async def test_search_failure_is_a_python_error_in_the_sandbox(config: SandboxConfig) -> None:
    async with Sandbox(DOCS, FakeSearch(fail=True), config) as box:
        result = await box.run(
            "try:\n    await search('x')\nexcept RuntimeError as e:\n    print('caught', e)"
        )
    assert ok(result) == "caught search failed: index is offline\n"


async def test_list_documents(sandbox: Sandbox) -> None:
    result = await sandbox.run("await list_documents()")
    assert eval(ok(result)) == [
        {
            "id": MANUAL.document.id,
            "uri": MANUAL.document.uri,
            "title": "Manual",
            "metadata": {"lang": "en"},
        },
        {"id": RECIPE.document.id, "uri": RECIPE.document.uri, "title": "Pasta", "metadata": {}},
    ]


# -- limits -----------------------------------------------------------------------------------


async def test_infinite_loop_times_out_and_the_next_call_is_fresh(search: FakeSearch) -> None:
    config = SandboxConfig(code_timeout=1.0, max_output_chars=2000)
    async with Sandbox(DOCS, search, config) as box:
        ok(await box.run("old = 1"))
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await box.run("print('spinning')\nwhile True:\n    pass")
        assert loop.time() - started < 3
        assert result.timed_out
        assert result.error == (
            "Execution stopped after 1 s (sandbox.code_timeout); "
            "variables from earlier calls are gone."
        )
        assert result.output == "spinning\n"
        assert not result.restarted
        after = await box.run("old")
        assert after.restarted and not after.timed_out
        assert after.error is not None and "NameError" in after.error
        doc_id = MANUAL.document.id
        again = await box.run(f"open('{doc_id}/content.txt').read()[:8]")
        assert ok(again) == repr("# Safety") and not again.restarted


async def test_timeout_covers_sleep_and_slow_host_calls() -> None:
    config = SandboxConfig(code_timeout=1.0, max_output_chars=2000)
    slow = FakeSearch(delay=30)
    async with Sandbox(DOCS, slow, config) as box:
        result = await box.run("import time\ntime.sleep(5)")
        assert result.timed_out
        result = await box.run("await search('x')")
        assert result.timed_out and result.restarted
        assert slow.calls == [("x", None)]
    # Monty leaves the host call running when the feed is cancelled; the sandbox stops it.
    assert slow.cancelled


async def test_memory_limit_is_a_python_error(sandbox: Sandbox) -> None:
    ok(await sandbox.run("kept = 1"))
    result = await sandbox.run("big = 'x' * (2 * 1024 ** 3)")
    assert result.error is not None and "MemoryError" in result.error
    assert ok(await sandbox.run("kept")) == "1"


async def test_crashed_worker_is_replaced(sandbox: Sandbox) -> None:
    ok(await sandbox.run("old = 1"))
    session = sandbox._session
    assert session is not None and session.worker_pid is not None
    os.kill(session.worker_pid, signal.SIGKILL)
    crashed = await sandbox.run("old")
    assert crashed.error is not None
    assert "crashed" in crashed.error and "variables from earlier calls are gone" in crashed.error
    after = await sandbox.run("old")
    assert after.restarted
    assert after.error is not None and "NameError" in after.error
    assert ok(await sandbox.run("1 + 1")) == "2"


async def test_cancelled_run_discards_the_interpreter(sandbox: Sandbox) -> None:
    ok(await sandbox.run("old = 1"))
    task = asyncio.create_task(sandbox.run("while True:\n    pass"))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    after = await sandbox.run("old")
    assert after.restarted and after.error is not None and "NameError" in after.error


async def test_output_is_capped_with_a_marker(search: FakeSearch) -> None:
    config = SandboxConfig(code_timeout=5.0, max_output_chars=50)
    async with Sandbox(DOCS, search, config) as box:
        printed = await box.run("for i in range(100):\n    print('x' * 9)")
        assert printed.output == "x" * 9 + "\n" + ("x" * 9 + "\n") * 4 + (
            "\n... [output truncated: 950 more characters]"
        )
        value = await box.run("'y' * 100")
        assert value.output == "'" + "y" * 49 + "\n... [output truncated: 52 more characters]"
        both = await box.run("print('z' * 60)\n123")
        assert both.output.endswith("[output truncated: 15 more characters]")
        assert both.output.startswith("z" * 50)
        error = await box.run("raise ValueError('e' * 500)")
        assert error.error is not None and "more characters]" in error.error


async def test_runs_are_serialized(sandbox: Sandbox) -> None:
    first, second = await asyncio.gather(
        sandbox.run("import time\ntime.sleep(0.2)\nshared = 1"), sandbox.run("shared + 1")
    )
    assert ok(first) == "" and ok(second) == "2"


# -- lifecycle ----------------------------------------------------------------------------------


async def test_run_once_uses_a_fresh_namespace(search: FakeSearch, config: SandboxConfig) -> None:
    assert ok(await run_once(DOCS, search, config, "x = 5\nx")) == "5"
    result = await run_once(DOCS, search, config, "x")
    assert result.error is not None and "NameError" in result.error
    assert not result.restarted


async def test_aclose_is_idempotent(search: FakeSearch, config: SandboxConfig) -> None:
    never_started = Sandbox(DOCS, search, config)
    await never_started.aclose()
    await never_started.aclose()

    box = Sandbox(DOCS, search, config)
    ok(await box.run("1"))
    await box.aclose()
    await box.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await box.run("1")


async def test_missing_worker_binary_is_a_clear_error(
    search: FakeSearch, config: SandboxConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MONTY_BIN", "/nonexistent/monty")
    async with Sandbox(DOCS, search, config) as box:
        with pytest.raises(SandboxError, match="Cannot start the Monty sandbox"):
            await box.run("1")


@pytest.mark.parametrize(
    ("documents", "message"),
    [
        ([MANUAL, MANUAL], "mounted twice"),
        (
            [MountedDocument(MANUAL.document.model_copy(update={"id": "../x"}), [])],
            "cannot be used as a directory name",
        ),
        ([MountedDocument(MANUAL.document.model_copy(update={"id": ".."}), [])], "directory name"),
        ([MountedDocument(RECIPE.document, MANUAL.chunks)], "belongs to document"),
    ],
)
def test_invalid_documents_are_rejected(
    documents: list[MountedDocument], message: str, search: FakeSearch, config: SandboxConfig
) -> None:
    with pytest.raises(ValueError, match=message):
        Sandbox(documents, search, config)
