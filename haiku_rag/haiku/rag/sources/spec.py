"""Source specs as text: split, classify, expand braces, and match globs.

Everything here is pure (no filesystem, no network), so the grammar of a spec
can be tested and reasoned about on its own. `Scope` lives here because what a
spec owns is decided by its text alone.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit, urlunsplit
from urllib.request import url2pathname

from haiku.rag.errors import SourceError

GLOB_MAGIC = frozenset("*?[")


@dataclass(frozen=True)
class SourceFailure:
    """One item a spec expanded to that could not be loaded; the rest of the spec still loads."""

    uri: str
    reason: str


@dataclass(frozen=True)
class Scope:
    """Uris a spec owns, so documents it no longer yields can be pruned.

    `exact` and `prefix` compare the uri as stored (file uris percent-encoded, as
    `Path.as_uri()` writes them). `glob` patterns are `file://` + an absolute glob
    and are matched against the percent-decoded uri: `*`, `?` and `[...]` stay
    within one path segment, a `**` segment spans directories, and wildcards do
    not match hidden names (those starting with a dot), exactly as loading does.
    """

    kind: Literal["prefix", "glob", "exact"]
    pattern: str
    suffixes: tuple[str, ...] = ()
    """For `prefix` scopes of a directory: only these file types (lower case), and no
    hidden names below the prefix, since a directory loads nothing else."""

    def covers(self, uri: str) -> bool:
        if self.kind == "exact":
            return uri == self.pattern
        if self.kind == "prefix":
            if not uri.startswith(self.pattern):
                return False
            if not self.suffixes:
                return True
            # `file.zip#entry` is a loader's entry of file.zip: judge it by the file
            rest = unquote(uri[len(self.pattern) :].partition("#")[0])
            hidden = any(part.startswith(".") for part in rest.split("/"))
            return not hidden and os.path.splitext(rest)[1].lower() in self.suffixes
        if not uri.startswith("file:"):
            return False
        file_uri = uri.partition("#")[0]  # a file uri's own `#` is percent-encoded
        return compile_glob(self.pattern).fullmatch(unquote(file_uri)) is not None


@dataclass(frozen=True)
class PathSpec:
    """A file or a directory (`~` already expanded)."""

    raw: str
    path: str


@dataclass(frozen=True)
class GlobSpec:
    """A glob, brace-expanded into `patterns`; `path` is the literal text, tried first."""

    raw: str
    path: str
    patterns: tuple[str, ...]


@dataclass(frozen=True)
class UrlSpec:
    """One web page."""

    raw: str
    url: str


@dataclass(frozen=True)
class CrawlSpec:
    """`https://host/path/**`: every page reachable from `prefix` whose url starts with it."""

    raw: str
    prefix: str


@dataclass(frozen=True)
class LoaderSpec:
    """`name:input`, where `name` is a configured document loader (see `loaders.py`)."""

    raw: str
    loader: str
    argument: str


@dataclass(frozen=True)
class CommandSpec:
    """`` `command` ``: the output of a shell command (see `loaders.py`)."""

    raw: str
    command: str


Spec = PathSpec | GlobSpec | UrlSpec | CrawlSpec | LoaderSpec | CommandSpec


def split_specs(specs: str | Sequence[str]) -> list[str]:
    """`a;b` is two specs; a bare string is one spec, not a sequence of characters.

    A `;` between backticks belongs to the command (`` `make; cat log` ``).
    """
    items = [specs] if isinstance(specs, str) else list(specs)
    parts = [part.strip() for item in items for part in _split_outside_backticks(item)]
    return [part for part in parts if part]


def _split_outside_backticks(item: str) -> list[str]:
    parts, start, quoted = [], 0, False
    for index, char in enumerate(item):
        if char == "`":
            quoted = not quoted
        elif char == ";" and not quoted:
            parts.append(item[start:index])
            start = index + 1
    parts.append(item[start:])
    return parts


def parse_spec(text: str, loaders: Collection[str] = ()) -> Spec:
    """Classify one spec by its text alone; the loaders decide what exists.

    `loaders` are the configured document loader names: `name:input` with one of
    them is a `LoaderSpec`. `` `cmd` `` is a `CommandSpec`.
    """
    text = text.strip()
    lowered = text.lower()
    if len(text) >= 2 and text.startswith("`") and text.endswith("`"):
        if not text[1:-1].strip():
            raise SourceError("Empty command source ``: put a command between the backticks")
        return CommandSpec(raw=text, command=text[1:-1].strip())
    name, colon, argument = text.partition(":")
    if colon and name in loaders:
        if not argument.strip():
            raise SourceError(f"{text!r} names the loader {name!r} but no input after the colon")
        return LoaderSpec(raw=text, loader=name, argument=argument.strip())
    if lowered.startswith(("http://", "https://")):
        return _parse_url(text)
    path = url2pathname(urlsplit(text).path) if lowered.startswith("file://") else text
    path = os.path.expanduser(path)
    patterns = expand_braces(path)
    if len(patterns) > 1 or has_magic(patterns[0]):
        return GlobSpec(raw=text, path=path, patterns=tuple(patterns))
    return PathSpec(raw=text, path=path)


def _parse_url(text: str) -> UrlSpec | CrawlSpec:
    if not urlsplit(text).hostname:
        raise SourceError(f"Invalid URL: {text} (expected http(s)://host/path)")
    if text.endswith("/**") and "*" not in text[:-3]:
        return CrawlSpec(raw=text, prefix=normalize_url(text[:-2]))
    if "*" in text:
        raise SourceError(
            f"Unsupported URL pattern: {text} (only a trailing /** is supported, to crawl a site)"
        )
    return UrlSpec(raw=text, url=text)


def normalize_url(url: str) -> str:
    """The identity of a page for crawling: query and fragment dropped, scheme and host lowered."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path or "/", "", ""))


def has_magic(pattern: str) -> bool:
    return any(char in GLOB_MAGIC for char in pattern)


def expand_braces(pattern: str) -> list[str]:
    """`a{b,c}d` -> `abd`, `acd` (nested and repeated groups too), as a shell does.

    A group without a top-level comma, or an unbalanced brace, stays literal.
    """
    group = _first_group(pattern)
    if group is None:
        return [pattern]
    start, end, alternatives = group
    results: list[str] = []
    for alternative in alternatives:
        for expanded in expand_braces(pattern[:start] + alternative + pattern[end + 1 :]):
            if expanded not in results:
                results.append(expanded)
    return results


def _first_group(pattern: str) -> tuple[int, int, list[str]] | None:
    """The first `{...}` holding a top-level comma: its bounds and its alternatives."""
    for start, char in enumerate(pattern):
        if char != "{":
            continue
        depth, cuts = 0, [start]
        for index in range(start, len(pattern)):
            if pattern[index] == "{":
                depth += 1
            elif pattern[index] == "}":
                depth -= 1
                if depth == 0:
                    if len(cuts) == 1:
                        break  # `{x}`: literal, look for the next group
                    cuts.append(index)
                    pieces = [pattern[a + 1 : b] for a, b in itertools.pairwise(cuts)]
                    return start, index, pieces
            elif pattern[index] == "," and depth == 1:
                cuts.append(index)
    return None


def split_glob(pattern: str) -> tuple[str, str]:
    """`/a/b/**/*.md` -> (`/a/b`, `**/*.md`): the literal directory to walk and what to match."""
    parts = pattern.split("/")
    literal = 0
    while literal < len(parts) - 1 and not has_magic(parts[literal]):
        literal += 1
    base = "/".join(parts[:literal])
    if literal == 1 and parts[0] == "":
        base = "/"
    return base, "/".join(parts[literal:])


def glob_to_regex(pattern: str) -> str:
    """Translate a `/`-separated glob to a regex for `fullmatch` (see `Scope` for the rules)."""
    parts = pattern.split("/")
    pieces: list[str] = []
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            pieces.append(r"(?:(?!\.)[^/]+/)*" + (r"(?!\.)[^/]+" if last else ""))
        else:
            pieces.append(_segment_regex(part) + ("" if last else "/"))
    return "".join(pieces)


def _segment_regex(segment: str) -> str:
    out = [] if segment.startswith(".") else [r"(?!\.)"]
    index = 0
    while index < len(segment):
        char = segment[index]
        index += 1
        if char == "*":
            out.append(r"[^/]*")
        elif char == "?":
            out.append(r"[^/]")
        elif char == "[" and (close := _class_end(segment, index)) > 0:
            body = segment[index:close]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            body = "".join("-" if c == "-" else re.escape(c) for c in body)
            out.append("[" + ("^/" if negate else "") + body + "]")
            index = close + 1
        else:
            out.append(re.escape(char))
    return "".join(out)


def _class_end(segment: str, start: int) -> int:
    """Index of the `]` closing a class opened just before `start`, or -1 (then `[` is literal)."""
    index = start
    if index < len(segment) and segment[index] == "!":
        index += 1
    if index < len(segment) and segment[index] == "]":
        index += 1
    return segment.find("]", index)


@functools.lru_cache(maxsize=256)
def compile_glob(pattern: str) -> re.Pattern[str]:
    return re.compile(glob_to_regex(pattern))
