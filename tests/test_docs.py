"""Code blocks marked `<!-- runnable -->` in the docs are executed, so they cannot rot.

The terms a runnable block can count on are documented in docs/contributing.md: the
blocks of a page run in order in one namespace, with top-level `await`, in a fresh
directory holding `docs/` (sample Markdown) and a `haiku.rag.yaml` selecting the
`hash:v1` embedder, with every chat model name resolved to a scripted model and
`haiku-rag` on PATH.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from scripted_models import offline_models  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- runnable -->"
FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,}|~{3,})\s*(?P<info>.*)$")
PAGE_TIMEOUT = 180.0

SAMPLE_DOCS = {
    "manual.md": "# Site safety manual\n\n## Safety equipment\n\nEveryone on site wears a "
    "hard hat, safety glasses and steel-toed boots. Hearing protection is required near "
    "the compressors.\n\n## First aid\n\nThe first aid kit hangs next to the main door.\n",
    "retrieval.md": "# Retrieval\n\nVector search and BM25 run side by side; Reciprocal "
    "Rank Fusion merges their rankings with weights 1.125 and 1.0.\n",
    "recipes/pasta.md": "# Pasta\n\nBoil salted water and cook the spaghetti for nine minutes.\n",
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    """1-based line of the first line of code (after the fence)."""
    code: str


def runnable_blocks(text: str, page: str) -> list[Block]:
    """The Python blocks preceded by MARKER, outside other fences; a stray marker is an error."""
    lines = text.splitlines()
    blocks: list[Block] = []
    fence: str | None = None  # the closing fence of the block we are in, if any
    pending: int | None = None  # line index of a marker waiting for its block
    index = 0
    while index < len(lines):
        line = lines[index]
        match = FENCE.match(line)
        if fence is not None:
            if line.strip() == fence:
                fence = None
        elif line.strip() == MARKER:
            if pending is not None:
                raise ValueError(f"{page}:{pending + 1}: {MARKER} is not followed by a block")
            pending = index
        elif match is not None:
            ticks, info = match["ticks"], match["info"].strip()
            language = info.split()[0].lstrip("{.") if info else ""
            if pending is not None:
                if language not in ("python", "py"):
                    raise ValueError(
                        f"{page}:{pending + 1}: {MARKER} must precede a ```python block, "
                        f"not {line.strip()!r}"
                    )
                end = index + 1
                while end < len(lines) and lines[end].strip() != ticks:
                    end += 1
                if end == len(lines):
                    raise ValueError(f"{page}:{index + 1}: the runnable block is never closed")
                indent = len(match["indent"])
                code = "\n".join(body[indent:] for body in lines[index + 1 : end])
                blocks.append(Block(page, index + 2, code + "\n"))
                pending = None
                index = end
            else:
                fence = ticks
        elif line.strip() and pending is not None:
            raise ValueError(f"{page}:{pending + 1}: {MARKER} is not followed by a block")
        index += 1
    if pending is not None:
        raise ValueError(f"{page}:{pending + 1}: {MARKER} is not followed by a block")
    return blocks


def doc_pages() -> list[Path]:
    return [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]


def all_blocks() -> dict[str, list[Block]]:
    pages: dict[str, list[Block]] = {}
    for path in doc_pages():
        name = str(path.relative_to(ROOT))
        blocks = runnable_blocks(path.read_text(encoding="utf-8"), name)
        if blocks:
            pages[name] = blocks
    return pages


PAGES = all_blocks()


def test_the_docs_have_runnable_blocks() -> None:
    """Losing every marker (say, by a rename) would silently test nothing."""
    assert sum(len(blocks) for blocks in PAGES.values()) >= 2


@pytest.fixture
def docs_sandbox(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    offline_models: object,  # noqa: F811
) -> Path:
    """The directory runnable blocks run in (see the module docstring)."""
    root = tmp_path / "sandbox"
    for name, text in SAMPLE_DOCS.items():
        path = root / "docs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    config = {
        "embeddings": {"model": "hash:v1", "dimension": 256},
        "storage": {"data_dir": str(root / "data")},
    }
    (root / "haiku.rag.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    monkeypatch.chdir(root)
    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ.get("PATH", ""))
    return root


async def run_block(block: Block, namespace: dict[str, object]) -> None:
    code = compile(
        block.code, f"{block.page}:{block.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    )
    # Line numbers in tracebacks point into the page.
    code = code.replace(co_firstlineno=block.line)
    result = eval(code, namespace)
    if inspect.iscoroutine(result):
        await result


@pytest.mark.parametrize("page", sorted(PAGES))
async def test_runnable_blocks(page: str, docs_sandbox: Path) -> None:
    namespace: dict[str, object] = {"__name__": "__docs__"}
    async with asyncio.timeout(PAGE_TIMEOUT):
        for block in PAGES[page]:
            await run_block(block, namespace)


# the marker parser -----------------------------------------------------------------------


def test_parser_finds_marked_python_blocks_only() -> None:
    text = "\n".join(
        [
            "```python",
            "print('not marked')",
            "```",
            "<!-- runnable -->",
            "",
            "```python",
            "x = 1",
            "```",
            "````markdown",
            "<!-- runnable -->",
            "```python",
            "inside_an_example = True",
            "```",
            "````",
            "- list item:",
            "  <!-- runnable -->",
            "  ```py",
            "  y = 2",
            "  ```",
        ]
    )
    blocks = runnable_blocks(text, "page.md")
    assert [(b.line, b.code) for b in blocks] == [(7, "x = 1\n"), (18, "y = 2\n")]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("<!-- runnable -->\n```bash\nls\n```", "must precede a ```python block"),
        ("<!-- runnable -->\nSome prose.\n", "is not followed by a block"),
        ("<!-- runnable -->\n<!-- runnable -->\n```python\n```", "is not followed by a block"),
        ("<!-- runnable -->\n", "is not followed by a block"),
        ("<!-- runnable -->\n```python\nx = 1\n", "never closed"),
    ],
)
def test_parser_rejects_stray_markers(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        runnable_blocks(text, "page.md")


async def test_blocks_share_a_namespace_and_tracebacks_point_into_the_page() -> None:
    namespace: dict[str, object] = {}
    await run_block(
        Block("p.md", 10, "import asyncio\nawait asyncio.sleep(0)\nx = 41\n"), namespace
    )
    await run_block(Block("p.md", 20, "y = x + 1\n"), namespace)
    assert namespace["y"] == 42
    with pytest.raises(ZeroDivisionError) as raised:
        await run_block(Block("p.md", 30, "\n1 / 0\n"), namespace)
    assert raised.traceback[-1].frame.code.path == "p.md:30"
    assert raised.traceback[-1].lineno + 1 == 31
