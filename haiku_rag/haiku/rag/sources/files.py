"""Local sources: a file, a directory (recursive), or a glob, resolved then read.

Resolving (which files, what the spec owns) happens before anything is read, so
a spec naming a missing path fails before any slow work starts. A spec naming
one file raises when it cannot be read; a spec expanding to many files reports
each unreadable one as a `SourceFailure` and loads the rest.
"""

from __future__ import annotations

import mimetypes
import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

from haiku.rag.documents import Document
from haiku.rag.errors import SourceError
from haiku.rag.sources.html import decode_text, html_to_markdown, markdown_title
from haiku.rag.sources.spec import (
    GlobSpec,
    PathSpec,
    Scope,
    SourceFailure,
    compile_glob,
    split_glob,
)

TEXT_TYPES: dict[str, str] = {
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".txt": "text/plain",
    ".text": "text/plain",
    ".rst": "text/x-rst",
    ".html": "text/html",
    ".htm": "text/html",
}
"""What a directory spec loads, by suffix (case-insensitive); everything else is skipped."""


@dataclass(frozen=True)
class FilePlan:
    """The files a spec resolved to, what it owns, and what could not even be listed.

    `strict`: the spec named one file, so failing to read it is an error, not a failure.
    """

    paths: tuple[Path, ...]
    scopes: tuple[Scope, ...]
    failures: tuple[SourceFailure, ...] = ()
    strict: bool = False


@dataclass
class _Walk:
    """Files found under a directory, plus the directories that could not be listed."""

    files: list[Path] = field(default_factory=list)
    failures: list[SourceFailure] = field(default_factory=list)


def plan_files(spec: PathSpec | GlobSpec, loader_suffixes: Collection[str] = ()) -> FilePlan:
    """Resolve a path or glob spec on disk; raises SourceError when it names nothing.

    `loader_suffixes` (`.pdf`, ...) are extensions a document loader reads: a
    directory loads (and owns) those files too.
    """
    if isinstance(spec, GlobSpec) and not os.path.lexists(spec.path):
        return _plan_glob(spec)
    path = Path(spec.path).resolve()
    if path.is_dir():
        return _plan_directory(path, tuple(s.lower() for s in loader_suffixes))
    if path.is_file():
        return FilePlan(paths=(path,), scopes=(Scope("exact", path.as_uri()),), strict=True)
    if path.exists():
        raise SourceError(f"Not a regular file or directory: {path} (give a file or a directory)")
    raise SourceError(f"No such file or directory: {path} (check the path)")


def _plan_directory(root: Path, loader_suffixes: tuple[str, ...] = ()) -> FilePlan:
    walk = _walk(root, compile_glob("**/*"), recursive=True, max_depth=0, hidden=False)
    suffixes = tuple(sorted({*TEXT_TYPES, *loader_suffixes}))
    paths = [path for path in walk.files if path.suffix.lower() in suffixes]
    # A directory owns only what it would load: the known text types (and loader
    # extensions), hidden names excluded, so `add dir/` never prunes a document
    # added from `dir/data.csv`.
    prefix = Scope("prefix", _as_directory(root.as_uri()), suffixes=suffixes)
    return FilePlan(tuple(paths), (prefix,), tuple(walk.failures))


def _plan_glob(spec: GlobSpec) -> FilePlan:
    paths: dict[Path, None] = {}
    scopes: list[Scope] = []
    failures: list[SourceFailure] = []
    for pattern in spec.patterns:
        base_text, rest = split_glob(pattern)
        base = Path(base_text or ".").resolve()
        scopes.append(Scope("glob", _as_directory(unquote(base.as_uri())) + rest))
        if not base.is_dir():
            continue
        parts = rest.split("/")
        walk = _walk(
            base,
            compile_glob(rest),
            recursive="**" in parts,
            max_depth=len(parts) - 1,
            hidden=any(part.startswith(".") for part in parts),
        )
        paths.update(dict.fromkeys(walk.files))
        failures.extend(walk.failures)
    if not paths:
        raise SourceError(
            f"No files match {spec.raw} (check the pattern; wildcards do not match hidden names)"
        )
    return FilePlan(tuple(sorted(paths)), tuple(scopes), tuple(failures))


def _as_directory(uri: str) -> str:
    """`file:///a` -> `file:///a/`, so a prefix never matches a sibling like `/ab`."""
    return uri if uri.endswith("/") else uri + "/"


def _walk(
    root: Path, pattern: re.Pattern[str], *, recursive: bool, max_depth: int, hidden: bool
) -> _Walk:
    """Files under `root` whose relative posix path fully matches `pattern`.

    Descends only as deep as the pattern can match and, unless it names hidden
    entries, skips hidden directories. Follows symlinked directories but enters
    each directory once, so a link loop ends. Unlistable directories are reported.
    """
    found = _Walk()
    entered: set[tuple[int, int]] = set()

    def report(error: OSError) -> None:
        where = Path(error.filename or root)
        found.failures.append(
            SourceFailure(where.as_uri(), f"Cannot list directory {where}: {error.strerror}")
        )

    for dirpath, dirnames, filenames in os.walk(root, onerror=report, followlinks=True):
        status = os.stat(dirpath)
        identity = (status.st_dev, status.st_ino)
        if identity in entered:
            dirnames[:] = []
            continue
        entered.add(identity)
        relative = Path(dirpath).relative_to(root)
        depth = len(relative.parts)
        descend = recursive or depth < max_depth
        dirnames[:] = sorted(d for d in dirnames if descend and (hidden or not d.startswith(".")))
        for name in sorted(filenames):
            if pattern.fullmatch((relative / name).as_posix()):
                found.files.append(Path(dirpath) / name)
    found.files.sort()
    return found


def read_file_document(path: Path) -> Document:
    """Read and convert one file; raises SourceError naming the file and the fix."""
    try:
        data = path.read_bytes()
        mtime = path.stat().st_mtime
    except OSError as exc:
        raise SourceError(
            f"Cannot read {path}: {exc.strerror} (check it exists and is readable)"
        ) from None
    return file_document(path, data, mtime)


def file_document(path: Path, data: bytes, mtime: float) -> Document:
    """A Document from a file's bytes: HTML becomes Markdown, other text is kept as is."""
    content_type = content_type_for(path)
    try:
        if content_type == "text/html":
            page = html_to_markdown(data)
            text, title = page.markdown, page.title
        else:
            text = decode_text(data)
            title = markdown_title(text)
    except ValueError as exc:
        raise SourceError(
            f"Not a text file: {path} ({exc}; convert it to UTF-8 text or load it another way)"
        ) from None
    return Document.from_text(
        text,
        uri=path.as_uri(),
        title=title or path.stem,
        metadata={
            "source": "file",
            "path": str(path),
            "content_type": content_type,
            "mtime": datetime.fromtimestamp(mtime, UTC).isoformat(),
        },
    )


def content_type_for(path: Path) -> str:
    """Known text types by suffix; anything else named explicitly is read as plain text."""
    known = TEXT_TYPES.get(path.suffix.lower())
    return known or mimetypes.guess_type(path.name)[0] or "text/plain"
