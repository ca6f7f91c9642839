"""Recursive character splitter: documents -> chunks small enough to embed and cite.

Sizes are in characters. A piece of text is split on the first separator (in the
order given) that occurs in it; the pieces are merged greedily back up to the size,
and pieces still too big are split again with the separators that follow. The last
separator, "", cuts hard. Separators are chosen by file type so chunks break at
Markdown headings, code definitions, paragraphs, lines, sentences, then words.

Every chunk is a verbatim slice of the document: `text[start:start + len(chunk)]`
is the chunk, so citations can point back into the source.
"""

from __future__ import annotations

import bisect
import itertools
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import urlparse

from haiku.rag.documents import Chunk, Document, chunk_id_for

MARKDOWN_SEPARATORS: tuple[str, ...] = (
    "\n# ",
    "\n## ",
    "\n### ",
    "\n#### ",
    "\n```",
    "\n\n",
    "\n",
    ". ",
    " ",
    "",
)
PLAIN_SEPARATORS: tuple[str, ...] = ("\n\n", "\n", ". ", " ", "")
PYTHON_SEPARATORS: tuple[str, ...] = (
    "\nclass ",
    "\ndef ",
    "\nasync def ",
    "\n\n",
    "\n    def ",
    "\n    async def ",
    "\n",
    " ",
    "",
)
# Other languages: blank lines are the one structure they all share (two blank lines
# usually separate top-level definitions); sentence breaks mean nothing in code.
CODE_SEPARATORS: tuple[str, ...] = ("\n\n\n", "\n\n", "\n", " ", "")

MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdown", ".mkd", ".mdx"})
CODE_SUFFIXES = frozenset(
    {
        ".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx", ".go", ".rs", ".java", ".kt", ".kts",
        ".scala", ".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".cs", ".swift", ".rb", ".php",
        ".lua", ".r", ".jl", ".sh", ".bash", ".zsh", ".sql", ".hs", ".ex", ".exs", ".erl",
        ".dart", ".m", ".mm", ".pl", ".zig", ".nim", ".vue", ".svelte",
    }
)  # fmt: skip
PYTHON_SUFFIXES = frozenset({".py", ".pyi", ".pyw"})

_ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*\r?$", re.MULTILINE)
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*?)\r?$", re.MULTILINE)
_MD_LINK = re.compile(r"\[[^\]\n]+\]\([^)\s]+\)")
_NON_SPACE = re.compile(r"\S")
_WHITESPACE = re.compile(r"\s")
_HEADING_LOOKAHEAD = 64  # blank space allowed between a chunk start and its heading


def default_overlap(size: int) -> int:
    """5% of the size: enough to carry a sentence across a cut, cheap in storage."""
    return size * 5 // 100


def _suffix(uri: str) -> str:
    path = urlparse(uri).path if "://" in uri else uri
    return PurePosixPath(path.replace("\\", "/")).suffix.lower()


def looks_like_markdown(content: str) -> bool:
    """Sniff Markdown in files without a telling suffix (web pages arrive as Markdown)."""
    headings = len(_ATX_HEADING.findall(content))
    fences = len(_FENCE.findall(content))
    links = _MD_LINK.search(content) is not None
    return headings >= 2 or fences >= 2 or (headings == 1 and links)


def separators_for(uri: str, content: str | None = None) -> tuple[str, ...]:
    """Separators for a document by suffix; `content` is sniffed when the suffix says nothing."""
    suffix = _suffix(uri)
    if suffix in MARKDOWN_SUFFIXES:
        return MARKDOWN_SEPARATORS
    if suffix in PYTHON_SUFFIXES:
        return PYTHON_SEPARATORS
    if suffix in CODE_SUFFIXES:
        return CODE_SEPARATORS
    if content is not None and looks_like_markdown(content):
        return MARKDOWN_SEPARATORS
    return PLAIN_SEPARATORS


def _fence_spans(text: str) -> list[tuple[int, int]]:
    """Fenced code blocks as (start of opening line, end of closing line) offsets.

    An unclosed fence runs to the end of the text, as in CommonMark.
    """
    spans: list[tuple[int, int]] = []
    opening: tuple[int, str] | None = None  # (start, fence marker)
    for match in _FENCE.finditer(text):
        marker, rest = match.group(1), match.group(2)
        if opening is None:
            if marker[0] == "`" and "`" in rest:
                continue  # "```foo`" is inline code, not a fence
            opening = (match.start(), marker)
        elif marker[0] == opening[1][0] and len(marker) >= len(opening[1]) and not rest.strip():
            spans.append((opening[0], match.end()))
            opening = None
    if opening is not None:
        spans.append((opening[0], len(text)))
    return spans


class _Fences:
    """Answers "is this offset inside fenced code?" in log time."""

    def __init__(self, text: str) -> None:
        self.spans = _fence_spans(text)
        self._starts = [start for start, _ in self.spans]

    def contains(self, offset: int) -> bool:
        index = bisect.bisect_right(self._starts, offset) - 1
        return index >= 0 and offset < self.spans[index][1]


def _headings(text: str, fences: _Fences) -> list[tuple[int, int, str]]:
    """ATX headings outside fenced code, as (line start, level, title)."""
    found = []
    for match in _ATX_HEADING.finditer(text):
        if not fences.contains(match.start()):
            found.append((match.start(), len(match.group(1)), match.group(2).strip()))
    return found


def markdown_headings_at(text: str) -> Callable[[int], list[str]]:
    """A lookup from an offset to the heading path above it, e.g. ["Install", "From source"].

    A heading line counts from its first character, so an offset on the heading
    itself is under that heading. '#' lines inside fenced code are not headings.
    """
    starts: list[int] = []
    paths: list[tuple[str, ...]] = []
    stack: list[tuple[int, str]] = []
    for start, level, title in _headings(text, _Fences(text)):
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
        starts.append(start)
        paths.append(tuple(title for _, title in stack))

    def headings_at(offset: int) -> list[str]:
        index = bisect.bisect_right(starts, offset) - 1
        return list(paths[index]) if index >= 0 else []

    return headings_at


@dataclass(frozen=True)
class _Span:
    """A chunk as offsets: [start, end) including overlap; `core` is where new text begins."""

    start: int
    end: int
    core: int


class _Splitter:
    """One split of one text; holds the offsets-only state the recursion needs."""

    def __init__(
        self, text: str, size: int, overlap: int, separators: Sequence[str], markdown: bool
    ) -> None:
        self.text = text
        self.size = size
        self.overlap = overlap
        self.separators = tuple(separators)
        self.fences = _Fences(text) if markdown else None
        self.heading_starts: frozenset[int] = (
            frozenset(start for start, _, _ in _headings(text, self.fences))
            if self.fences is not None
            else frozenset()
        )

    def is_clean_break(self, offset: int) -> bool:
        """A chunk starting here needs no overlap: the text start or a Markdown heading.

        Whitespace before the heading does not matter: chunks are stripped.
        """
        if offset == 0:
            return True
        if not self.heading_starts:
            return False
        first = _NON_SPACE.search(self.text, offset, offset + _HEADING_LOOKAHEAD)
        return first is not None and first.start() in self.heading_starts

    def budget(self, offset: int) -> int:
        """Room for new text in a chunk starting here, leaving space for its overlap."""
        return self.size if self.is_clean_break(offset) else self.size - self.overlap

    def points(self, lo: int, hi: int, separator: str) -> list[int]:
        """Offsets strictly inside (lo, hi) where a new piece starts."""
        if self.fences is not None and separator == "\n```":
            return self._fence_points(lo, hi)
        fences = self.fences if separator.startswith("\n#") else None
        # Leading punctuation (". ") ends the sentence before it; whitespace and
        # markers ("\n# ", "\ndef ") start the piece after it.
        shift = len(separator) - len(separator.lstrip(string.punctuation))
        found: list[int] = []
        position = self.text.find(separator, lo, hi)
        while position != -1:
            point = position + shift
            if lo < point < hi and not (fences is not None and fences.contains(position + 1)):
                found.append(point)
            position = self.text.find(separator, position + max(len(separator), 1), hi)
        return found

    def _fence_points(self, lo: int, hi: int) -> list[int]:
        """A fenced block becomes its own piece: cut before its opening and after its closing."""
        assert self.fences is not None
        found: set[int] = set()
        for start, end in self.fences.spans:
            for point in (start - 1, end):
                if lo < point < hi:
                    found.add(point)
        return sorted(found)

    def split(
        self, lo: int, hi: int, separators: Sequence[str], carry: int | None = None
    ) -> list[tuple[int, int]]:
        """Cores (chunk text without overlap) covering [lo, hi), each within its budget.

        `carry` is the start of text before `lo` still waiting for a chunk (a heading
        line, a short paragraph); it joins the first core if they fit together.
        """
        first = lo if carry is None else carry
        if hi - first <= self.budget(first):
            return [(first, hi)]
        for index, separator in enumerate(separators):
            if separator == "":
                break
            points = self.points(lo, hi, separator)
            if points:
                pieces = list(itertools.pairwise([lo, *points, hi]))
                group = None if carry is None else (carry, lo)
                return self.merge(pieces, separators[index + 1 :], group)
        return self.hard_cut(first, hi)

    def merge(
        self,
        pieces: list[tuple[int, int]],
        separators: Sequence[str],
        group: tuple[int, int] | None = None,
    ) -> list[tuple[int, int]]:
        """Greedily join neighbouring pieces while they fit; split the ones that never fit.

        Headings stay with their text: a pending group flows into the split of a
        too-big piece, and a chunk that must end is cut before the last heading in
        it when that heading fits with what follows. Small whole sections may share
        a chunk; the tail of a split section may not run into the next one.
        """
        cores: list[tuple[int, int]] = []
        tail = False  # the group ends a split piece
        section: int | None = None  # the last heading inside the group, after its start
        for start, end in pieces:
            clean = self.is_clean_break(start)
            if group is not None and clean and tail:
                cores.append(group)
                group = None
            big = end - start > self.budget(start)
            if (
                group is not None
                and section is not None
                and not clean
                and (
                    big
                    or (
                        end - group[0] > self.budget(group[0])
                        and end - section <= self.budget(section)
                    )
                )
            ):
                cores.append((group[0], section))
                group, section = (section, group[1]), None
            if big:
                carry = None
                if group is not None and not clean:
                    carry = group[0]
                elif group is not None:
                    cores.append(group)
                sub = self.split(start, end, separators, carry)
                cores.extend(sub[:-1])
                group, tail, section = sub[-1], True, None
            elif group is None:
                group, tail = (start, end), False
            elif end - group[0] <= self.budget(group[0]):
                group = (group[0], end)
                section = start if clean else section
            else:
                cores.append(group)
                group, tail, section = (start, end), False, None
        assert group is not None  # every piece leaves a group behind
        cores.append(group)
        return cores

    def hard_cut(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The last resort: cut wherever the budget runs out."""
        cores = []
        while lo < hi:
            end = min(hi, lo + self.budget(lo))
            cores.append((lo, end))
            lo = end
        return cores

    def overlap_start(self, core: int, previous_start: int) -> int:
        """Where a chunk's overlap begins: up to `overlap` characters back, at a word start.

        It stays after the previous chunk's start, so no chunk swallows the one before.
        """
        if self.overlap == 0 or self.is_clean_break(core):
            return core
        start = max(core - self.overlap, previous_start + 1)
        if 0 < start < core and not self.text[start - 1].isspace():
            space = _WHITESPACE.search(self.text, start, core)
            if space is not None:
                start = space.end()
        return min(start, core)

    def spans(self) -> list[_Span]:
        spans: list[_Span] = []
        for core, end in self.split(0, len(self.text), self.separators):
            first = _NON_SPACE.search(self.text, core, end)
            if first is None:  # a core of only whitespace adds nothing to embed
                continue
            previous_start = spans[-1].start if spans else -1
            start = _NON_SPACE.search(self.text, self.overlap_start(core, previous_start), end)
            assert start is not None  # the core itself has a non-space character
            stop = start.start() + len(self.text[start.start() : end].rstrip())
            spans.append(_Span(start.start(), stop, first.start()))
        return spans


def _split_spans(
    text: str, size: int, overlap: int, separators: Sequence[str], markdown: bool | None
) -> list[_Span]:
    if size <= 0:
        raise ValueError(f"chunk size must be positive, got {size}")
    if not 0 <= overlap < size:
        raise ValueError(f"chunk overlap must be >= 0 and below the size {size}, got {overlap}")
    if markdown is None:
        markdown = "\n```" in separators or any(s.startswith("\n#") for s in separators)
    return _Splitter(text, size, overlap, separators, markdown).spans()


def split_text(
    text: str,
    size: int,
    overlap: int,
    separators: Sequence[str],
    *,
    markdown: bool | None = None,
) -> list[tuple[int, str]]:
    """Split `text` into (start offset, chunk) pairs, each at most `size` characters.

    Each chunk after the first begins with up to `overlap` characters from the end
    of the one before (cut at a word start), except where it begins at a Markdown
    heading: a new section needs no context from the last one. Chunks are stripped
    of surrounding whitespace, never empty, and together cover every non-space
    character. `markdown` (inferred from the separators when None) makes heading
    separators ignore '#' lines in fenced code and keeps fenced blocks together.
    """
    return [
        (span.start, text[span.start : span.end])
        for span in _split_spans(text, size, overlap, separators, markdown)
    ]


def chunk_document(document: Document, size: int, overlap: int) -> list[Chunk]:
    """Chunks of a document with separators for its type and, for Markdown, heading paths."""
    text = document.content
    separators = separators_for(document.uri, text)
    markdown = separators == MARKDOWN_SEPARATORS
    headings_at = markdown_headings_at(text) if markdown else None
    chunks = []
    for order, span in enumerate(_split_spans(text, size, overlap, separators, markdown)):
        content = text[span.start : span.end]
        chunks.append(
            Chunk(
                id=chunk_id_for(document.id, order, content),
                document_id=document.id,
                order=order,
                content=content,
                start=span.start,
                # The path where the chunk's own text begins, not where its overlap does.
                headings=headings_at(span.core) if headings_at is not None else [],
            )
        )
    return chunks
