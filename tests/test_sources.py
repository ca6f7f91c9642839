"""Source specs -> documents, against real files in tmp_path and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import codecs
import hashlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from haiku.rag.errors import ConfigError, SourceError
from haiku.rag.sources import (
    CrawlLimits,
    Scope,
    SourceBatch,
    SourceFailure,
    load_sources,
)
from haiku.rag.sources.html import decode_text, html_to_markdown, markdown_title
from haiku.rag.sources.spec import (
    CrawlSpec,
    GlobSpec,
    PathSpec,
    UrlSpec,
    expand_braces,
    parse_spec,
    split_glob,
    split_specs,
)

# ---------------------------------------------------------------------------
# helpers and fixtures


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def unused_port() -> int:
    """A port nobody listens on (bound by the OS, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def uris(batch: SourceBatch) -> list[str]:
    return [document.uri for document in batch.documents]


def assert_owned(batch: SourceBatch) -> None:
    """Every loaded document is covered by a scope, or pruning would never see it."""
    for document in batch.documents:
        assert any(scope.covers(document.uri) for scope in batch.scopes), document.uri


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    """A small tree: nested text files, hidden entries, a file type that is not loaded."""
    root = tmp_path / "docs"
    write(root / "intro.md", "# Introduction\n\nHello.\n")
    write(root / "notes.txt", "plain notes\n")
    write(root / "guide" / "setup.md", "# Setup\n\nInstall it.\n")
    write(root / "guide" / "deep" / "README.md", "# Deep readme\n")
    write(root / "guide" / "usage.rst", "Usage\n=====\n")
    write(root / "api" / "README.md", "# API readme\n")
    write(root / "image.png", b"\x89PNG\r\n\x1a\n\x00\x00")
    write(root / "data.csv", "a,b\n1,2\n")
    write(root / ".git" / "HEAD.md", "# not me\n")
    write(root / ".hidden.md", "# not me either\n")
    write(root / "guide" / ".draft.md", "# draft\n")
    return root


@dataclass
class Route:
    body: bytes | str = b""
    content_type: str | None = "text/html; charset=utf-8"
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Site:
    """Routes served by the fixture server, and what was asked of it."""

    base: str = ""
    routes: dict[str, Route] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return self.base + path

    def page(self, path: str, title: str, *links: str, extra: str = "") -> None:
        anchors = "".join(f'<li><a href="{link}">{link}</a></li>' for link in links)
        html = (
            f"<html><head><title>{title} | Site</title></head><body>"
            f"<nav><ul>{anchors}</ul></nav><main><h1>{title}</h1>"
            f"<p>Text of {title}.</p>{extra}</main></body></html>"
        )
        self.routes[path] = Route(html)


@pytest.fixture
def site() -> Iterator[Site]:
    state = Site()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with state.lock:
                state.requests.append(self.path)
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                self._respond(state.routes.get(urlsplit(self.path).path))
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                with state.lock:
                    state.in_flight -= 1

        def _respond(self, route: Route | None) -> None:
            route = route or Route("<h1>Not here</h1>", status=404)
            time.sleep(route.delay)
            body = route.body.encode() if isinstance(route.body, str) else route.body
            self.send_response(route.status)
            if route.content_type:
                self.send_header("Content-Type", route.content_type)
            for name, value in route.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    state.base = f"http://127.0.0.1:{server.server_port}"
    yield state
    server.shutdown()
    server.server_close()


# ---------------------------------------------------------------------------
# spec grammar (pure)


def test_split_specs_on_semicolons_and_keeps_a_bare_string_whole() -> None:
    assert split_specs("a.md; b.md;;  c/ ") == ["a.md", "b.md", "c/"]
    assert split_specs(["a;b", "c"]) == ["a", "b", "c"]
    assert split_specs("docs") == ["docs"]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("d/**/*.{md,txt}", ["d/**/*.md", "d/**/*.txt"]),
        ("{a,b}{1,2}", ["a1", "a2", "b1", "b2"]),
        ("{a,{b,c}}.md", ["a.md", "b.md", "c.md"]),
        ("x{,s}", ["x", "xs"]),
        ("{a,a}", ["a"]),
        ("plain.md", ["plain.md"]),
        ("{x}.md", ["{x}.md"]),
        ("{x}{a,b}", ["{x}a", "{x}b"]),
        ("open{a,b", ["open{a,b"]),
    ],
)
def test_expand_braces(pattern: str, expected: list[str]) -> None:
    assert expand_braces(pattern) == expected


def test_split_glob_finds_the_literal_directory() -> None:
    assert split_glob("/a/b/**/*.md") == ("/a/b", "**/*.md")
    assert split_glob("*.md") == ("", "*.md")
    assert split_glob("/*.md") == ("/", "*.md")
    assert split_glob("d/a.md") == ("d", "a.md")


def test_parse_spec_classifies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert parse_spec("docs/a.md") == PathSpec("docs/a.md", "docs/a.md")
    assert parse_spec("~/a.md") == PathSpec("~/a.md", f"{tmp_path}/a.md")
    assert parse_spec("d/*.{md,txt}") == GlobSpec(
        "d/*.{md,txt}", "d/*.{md,txt}", ("d/*.md", "d/*.txt")
    )
    assert parse_spec("file:///tmp/a%20b.md") == PathSpec("file:///tmp/a%20b.md", "/tmp/a b.md")
    assert parse_spec("https://h.org/x?q=1") == UrlSpec(
        "https://h.org/x?q=1", "https://h.org/x?q=1"
    )
    assert parse_spec("HTTPS://Docs.Example.org/Guide/**") == CrawlSpec(
        "HTTPS://Docs.Example.org/Guide/**", "https://docs.example.org/Guide/"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("https:///nohost", "Invalid URL: https:///nohost (expected http(s)://host/path)"),
        ("https://h.org/*/x", "only a trailing /** is supported"),
        ("https://h.org/**/*.html", "only a trailing /** is supported"),
    ],
)
def test_bad_urls_are_refused(spec: str, message: str) -> None:
    with pytest.raises(SourceError, match=re.escape(message)):
        parse_spec(spec)


@pytest.mark.parametrize(
    ("scope", "uri", "covered"),
    [
        (Scope("exact", "file:///a/b.md"), "file:///a/b.md", True),
        (Scope("exact", "file:///a/b.md"), "file:///a/b.mdx", False),
        (Scope("prefix", "file:///a/"), "file:///a/x/y.md", True),
        (Scope("prefix", "file:///a/"), "file:///ab/y.md", False),
        (Scope("prefix", "https://h.org/docs/"), "https://h.org/docs/x", True),
        (Scope("glob", "file:///a/*.md"), "file:///a/x.md", True),
        (Scope("glob", "file:///a/*.md"), "file:///a/sub/x.md", False),
        (Scope("glob", "file:///a/*.md"), "file:///a/.x.md", False),
        (Scope("glob", "file:///a/**/*.md"), "file:///a/x.md", True),
        (Scope("glob", "file:///a/**/*.md"), "file:///a/s/t/x.md", True),
        (Scope("glob", "file:///a/**/*.md"), "file:///a/.git/x.md", False),
        (Scope("glob", "file:///a/**/*.md"), "file:///a/x.txt", False),
        (Scope("glob", "file:///a/**/R.md"), "file:///a/s/R.md", True),
        (Scope("glob", "file:///a/**/R.md"), "file:///a/s/X.md", False),
        (Scope("glob", "file:///a/**"), "file:///a/s/X.md", True),
        (Scope("glob", "file:///a/.cfg/*.md"), "file:///a/.cfg/x.md", True),
        (Scope("glob", "file:///a b/*.md"), "file:///a%20b/x.md", True),
        (Scope("glob", "file:///a/[!x]?.md"), "file:///a/y1.md", True),
        (Scope("glob", "file:///a/[!x]?.md"), "file:///a/x1.md", False),
        (Scope("glob", "file:///a/[a-c].md"), "file:///a/b.md", True),
        (Scope("glob", "file:///a/[]].md"), "file:///a/].md", True),
        (Scope("glob", "file:///a/x[.md"), "file:///a/x[.md", True),
        (Scope("glob", "file:///a/*.md"), "https://h.org/a/x.md", False),
    ],
)
def test_scope_covers(scope: Scope, uri: str, covered: bool) -> None:
    assert scope.covers(uri) is covered


# ---------------------------------------------------------------------------
# files


async def test_single_file(docs: Path) -> None:
    path = docs / "intro.md"
    batch = await load_sources([str(path)])
    [document] = batch.documents
    assert document.uri == path.as_uri() == f"file://{path}"
    assert document.title == "Introduction"
    assert document.content == "# Introduction\n\nHello.\n"
    assert document.content_hash == hashlib.sha256(document.content.encode()).hexdigest()
    assert document.metadata["source"] == "file"
    assert document.metadata["path"] == str(path)
    assert document.metadata["content_type"] == "text/markdown"
    assert document.metadata["mtime"].endswith("+00:00")
    assert batch.scopes == [Scope("exact", path.as_uri())]
    assert batch.failures == []


async def test_relative_path_becomes_absolute_uri(
    docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(docs.parent)
    batch = await load_sources(["docs/./guide/../intro.md"])
    assert uris(batch) == [(docs / "intro.md").as_uri()]


async def test_directory_is_recursive_sorted_and_skips_hidden_and_unknown_types(
    docs: Path,
) -> None:
    write(docs / "page.HTML", "<title>Upper</title><p>x</p>")
    batch = await load_sources([str(docs)])
    names = [Path(uri).relative_to(docs.as_uri()).as_posix() for uri in uris(batch)]
    assert names == [
        "api/README.md",
        "guide/deep/README.md",
        "guide/setup.md",
        "guide/usage.rst",
        "intro.md",
        "notes.txt",
        "page.HTML",
    ]
    assert [(scope.kind, scope.pattern) for scope in batch.scopes] == [
        ("prefix", docs.as_uri() + "/")
    ]
    assert batch.failures == []
    assert_owned(batch)
    assert not any(scope.covers(docs.as_uri() + "x/a.md") for scope in batch.scopes)
    # A directory owns only what it loads: other file types and hidden names are not its own.
    (scope,) = batch.scopes
    assert scope.covers(docs.as_uri() + "/sub/new.md")
    assert not scope.covers(docs.as_uri() + "/data.csv")
    assert not scope.covers(docs.as_uri() + "/.hidden/x.md")


async def test_a_hidden_directory_named_explicitly_is_loaded(docs: Path) -> None:
    batch = await load_sources([str(docs / ".git")])
    assert uris(batch) == [(docs / ".git/HEAD.md").as_uri()]


async def test_symlinked_directories_are_followed_once(docs: Path, tmp_path: Path) -> None:
    write(tmp_path / "elsewhere" / "linked.md", "# Linked\n")
    (docs / "guide" / "shared").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (docs / "guide" / "loop").symlink_to(docs, target_is_directory=True)
    batch = await load_sources([str(docs)])
    assert (docs / "guide/shared/linked.md").as_uri() in uris(batch)
    assert not any("/loop/" in uri for uri in uris(batch))
    assert len(batch.documents) == 7
    assert_owned(batch)


async def test_empty_directory_loads_nothing_but_still_owns_its_prefix(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    batch = await load_sources([str(tmp_path / "empty") + "/"])
    assert batch.documents == []
    assert [(s.kind, s.pattern) for s in batch.scopes] == [
        ("prefix", (tmp_path / "empty").as_uri() + "/")
    ]


async def test_glob_one_level(docs: Path) -> None:
    batch = await load_sources([f"{docs}/*.md"])
    assert uris(batch) == [(docs / "intro.md").as_uri()]  # not nested, not .hidden.md
    assert batch.scopes == [Scope("glob", f"file://{docs}/*.md")]
    assert_owned(batch)


async def test_brace_glob_recursive(docs: Path) -> None:
    batch = await load_sources([f"{docs}/**/*.{{md,txt}}"])
    assert uris(batch) == sorted(
        (docs / name).as_uri()
        for name in [
            "intro.md",
            "notes.txt",
            "guide/setup.md",
            "guide/deep/README.md",
            "api/README.md",
        ]
    )
    assert batch.scopes == [
        Scope("glob", f"file://{docs}/**/*.md"),
        Scope("glob", f"file://{docs}/**/*.txt"),
    ]
    assert_owned(batch)


async def test_glob_by_name_anywhere_below(docs: Path) -> None:
    batch = await load_sources([f"{docs}/**/README.md"])
    assert uris(batch) == [
        (docs / "api/README.md").as_uri(),
        (docs / "guide/deep/README.md").as_uri(),
    ]
    assert [document.title for document in batch.documents] == ["API readme", "Deep readme"]
    assert_owned(batch)


async def test_glob_that_names_hidden_entries_matches_them(docs: Path) -> None:
    batch = await load_sources([f"{docs}/**/.*.md"])
    assert uris(batch) == [(docs / ".hidden.md").as_uri(), (docs / "guide/.draft.md").as_uri()]
    assert_owned(batch)


async def test_glob_with_wildcard_directory(docs: Path) -> None:
    batch = await load_sources([f"{docs}/*/README.md"])
    assert uris(batch) == [(docs / "api/README.md").as_uri()]


async def test_glob_loads_any_type_it_names_and_reports_binaries(docs: Path) -> None:
    batch = await load_sources([f"{docs}/*.{{csv,png}}"])
    assert uris(batch) == [(docs / "data.csv").as_uri()]
    assert batch.documents[0].metadata["content_type"] == "text/csv"
    [failure] = batch.failures
    assert failure.uri == (docs / "image.png").as_uri()
    assert "Not a text file" in failure.reason
    assert "NUL bytes" in failure.reason


async def test_relative_glob(docs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(docs)
    batch = await load_sources(["*.txt"])
    assert uris(batch) == [(docs / "notes.txt").as_uri()]
    assert batch.scopes == [Scope("glob", f"file://{docs}/*.txt")]


async def test_literal_path_with_glob_characters_wins(tmp_path: Path) -> None:
    path = write(tmp_path / "notes[1].md", "# Bracketed\n")
    batch = await load_sources([str(path)])
    assert uris(batch) == [path.as_uri()]
    assert batch.scopes == [Scope("exact", path.as_uri())]


async def test_home_expansion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "kb" / "a.md", "# A\n")
    write(tmp_path / "kb" / "b.md", "# B\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    batch = await load_sources(["~/kb/a.md", "~/kb/*.md"])
    assert uris(batch) == [(tmp_path / "kb/a.md").as_uri(), (tmp_path / "kb/b.md").as_uri()]


async def test_file_uri_spec(docs: Path) -> None:
    batch = await load_sources([(docs / "notes.txt").as_uri()])
    assert uris(batch) == [(docs / "notes.txt").as_uri()]


async def test_semicolon_list_dedupes_and_keeps_spec_order(docs: Path) -> None:
    seen: list[str] = []
    batch = await load_sources(
        [f"{docs}/notes.txt;{docs}/guide", str(docs)], on_document=lambda d: seen.append(d.uri)
    )
    loaded = uris(batch)
    assert loaded[0] == (docs / "notes.txt").as_uri()
    assert loaded[1:4] == [
        (docs / "guide/deep/README.md").as_uri(),
        (docs / "guide/setup.md").as_uri(),
        (docs / "guide/usage.rst").as_uri(),
    ]
    assert loaded[4:] == [
        (docs / "api/README.md").as_uri(),
        (docs / "intro.md").as_uri(),
    ]
    assert len(set(loaded)) == len(loaded) == 6
    assert sorted(seen) == sorted(loaded)
    assert len(batch.scopes) == 3


async def test_binary_and_undecodable_files_in_a_directory_are_failures(tmp_path: Path) -> None:
    write(tmp_path / "ok.md", "# Fine\n")
    write(tmp_path / "nul.txt", b"abc\x00def")
    write(tmp_path / "latin1.txt", "café".encode("latin-1"))
    write(tmp_path / "page.html", b"<p>\x00</p>")
    (tmp_path / "gone.md").symlink_to(tmp_path / "missing-target.md")
    batch = await load_sources([str(tmp_path)])
    assert uris(batch) == [(tmp_path / "ok.md").as_uri()]
    reasons = {Path(f.uri).name: f.reason for f in batch.failures}
    assert set(reasons) == {"nul.txt", "latin1.txt", "gone.md", "page.html"}
    assert "NUL bytes" in reasons["nul.txt"]
    assert "NUL bytes" in reasons["page.html"]
    assert "not valid utf-8 text" in reasons["latin1.txt"]
    assert "convert it to UTF-8 text" in reasons["latin1.txt"]
    assert reasons["gone.md"].startswith(f"Cannot read {tmp_path / 'gone.md'}")


async def test_a_named_binary_file_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "blob.md", b"\x00\x01\x02")
    with pytest.raises(SourceError, match=f"Not a text file: {path}"):
        await load_sources([str(path)])


async def test_unlistable_directory_is_reported(
    docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_scandir = os.scandir
    locked = str(docs / "guide")

    def scandir(path: str) -> object:
        if str(path) == locked:
            raise PermissionError(13, "Permission denied", locked)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    batch = await load_sources([str(docs)])
    assert (docs / "intro.md").as_uri() in uris(batch)
    assert not any("/guide/" in uri for uri in uris(batch))
    assert batch.failures == [
        SourceFailure(
            (docs / "guide").as_uri(), f"Cannot list directory {locked}: Permission denied"
        )
    ]


async def test_text_decoding_bom_and_newlines(tmp_path: Path) -> None:
    write(tmp_path / "bom.md", codecs.BOM_UTF8 + b"# Bom\r\nline\r\n")
    write(tmp_path / "wide.txt", "# Wide\nüber\n".encode("utf-16"))
    write(tmp_path / "mac.txt", b"a\rb\r")
    batch = await load_sources([str(tmp_path)])
    contents = {Path(d.uri).name: d.content for d in batch.documents}
    assert contents == {
        "bom.md": "# Bom\nline\n",
        "mac.txt": "a\nb\n",
        "wide.txt": "# Wide\nüber\n",
    }
    assert [d.title for d in batch.documents] == ["Bom", "mac", "Wide"]


async def test_title_falls_back_to_the_file_stem(tmp_path: Path) -> None:
    write(tmp_path / "no-title.md", "```\n# not a title\n```\n\n## Second level\n")
    batch = await load_sources([str(tmp_path / "no-title.md")])
    assert batch.documents[0].title == "no-title"


async def test_html_file_becomes_markdown(tmp_path: Path) -> None:
    html = """<!doctype html><html><head><title>Manual | ACME</title>
    <style>body { color: red }</style><script>alert("x")</script></head>
    <body><header><a href="/">ACME home</a></header><nav>Menu</nav>
    <h1>Safety manual</h1><p>Wear <b>goggles</b>.</p><h2>Gloves</h2><ul><li>Nitrile</li></ul>
    <footer>Copyright ACME</footer></body></html>"""
    path = write(tmp_path / "manual.html", html)
    [document] = (await load_sources([str(path)])).documents
    assert document.title == "Safety manual"
    assert document.metadata["content_type"] == "text/html"
    assert document.content == ("# Safety manual\n\nWear **goggles**.\n\n## Gloves\n\n- Nitrile")


async def test_missing_path_names_the_path_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "x" / "y.md"
    with pytest.raises(SourceError) as info:
        await load_sources([str(missing)])
    assert str(info.value) == f"No such file or directory: {missing} (check the path)"


async def test_missing_path_fails_before_any_fetch(tmp_path: Path, site: Site) -> None:
    site.page("/a", "A")
    with pytest.raises(SourceError, match="No such file"):
        await load_sources([site.url("/a"), str(tmp_path / "nope.md")])
    assert site.requests == []


async def test_glob_matching_nothing_is_an_error(docs: Path) -> None:
    with pytest.raises(SourceError) as info:
        await load_sources([f"{docs}/**/*.pdf"])
    assert str(info.value).startswith(f"No files match {docs}/**/*.pdf (check the pattern")
    with pytest.raises(SourceError, match="No files match"):
        await load_sources([f"{docs}/nowhere/*.md"])


async def test_special_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(SourceError, match=f"Not a regular file or directory: {fifo}"):
        await load_sources([str(fifo)])


async def test_no_spec_at_all_is_an_error() -> None:
    with pytest.raises(SourceError, match="No source given"):
        await load_sources([" ; "])


# ---------------------------------------------------------------------------
# text helpers


def test_decode_text_refuses_what_is_not_text() -> None:
    with pytest.raises(ValueError, match="NUL"):
        decode_text(b"a\x00b")
    with pytest.raises(ValueError, match="not valid utf-8"):
        decode_text(b"\xfe\xfa")
    with pytest.raises(ValueError, match="not valid no-such-codec"):
        decode_text(b"abc", "no-such-codec")
    assert decode_text("é".encode("latin-1"), "latin-1") == "é"


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("# Title\n", "Title"),
        ("intro\n   #  Spaced title  ##\n", "Spaced title"),
        ("#NoSpace\n## Second\n", None),
        ("~~~\n# fenced\n~~~\n# After\n", "After"),
    ],
)
def test_markdown_title(text: str, title: str | None) -> None:
    assert markdown_title(text) == title


def test_html_links_are_absolute_and_normalised() -> None:
    page = html_to_markdown(
        '<base href="/docs/"><a href="a.html#top">A</a><a href="a.html?x=1">A again</a>'
        '<a href="mailto:x@y.org">mail</a><a href="HTTPS://Other.org/B">B</a>',
        base_url="https://site.org/index.html",
    )
    assert page.links == ("https://site.org/docs/a.html", "https://other.org/B")
    assert "[A](https://site.org/docs/a.html#top)" in page.markdown
    assert page.title is None


def test_article_header_is_kept_but_page_chrome_is_not() -> None:
    page = html_to_markdown(
        "<body><header>Site banner</header><article><header><h1>Post</h1></header>"
        "<p>Body</p><footer>Posted today</footer></article><footer>Site footer</footer></body>"
    )
    assert page.title == "Post"
    assert page.markdown == "# Post\n\nBody\n\nPosted today"


# ---------------------------------------------------------------------------
# single web pages


async def test_html_page(site: Site) -> None:
    site.routes["/manual"] = Route(
        "<html><head><title>Manual | ACME</title><script>var x = 1;</script>"
        "<style>p { }</style></head><body><nav><a href='/other'>Other</a></nav>"
        "<main><h1>Safety</h1><p>See <a href='/gloves'>gloves</a>.</p><h2>Goggles</h2>"
        "</main><footer>(c)</footer></body></html>"
    )
    batch = await load_sources([site.url("/manual")])
    [document] = batch.documents
    assert document.uri == site.url("/manual")
    assert document.title == "Safety"
    assert document.content == f"# Safety\n\nSee [gloves]({site.url('/gloves')}).\n\n## Goggles"
    assert document.metadata == {
        "source": "web",
        "url": site.url("/manual"),
        "content_type": "text/html",
    }
    assert batch.scopes == [Scope("exact", site.url("/manual"))]


async def test_html_title_then_url_segment_as_title(site: Site) -> None:
    site.routes["/t"] = Route("<title>Head title</title><p>no heading</p>")
    site.routes["/docs/last-part/"] = Route("<p>nothing</p>")
    site.routes["/"] = Route("<p>root</p>")
    batch = await load_sources([site.url("/t"), site.url("/docs/last-part/"), site.url("/")])
    titles = {d.uri: d.title for d in batch.documents}
    assert titles[site.url("/t")] == "Head title"
    assert titles[site.url("/docs/last-part/")] == "last-part"
    assert titles[site.url("/")] == "127.0.0.1"


async def test_plain_text_and_markdown_pages_are_kept_as_is(site: Site) -> None:
    site.routes["/a.txt"] = Route("just text\r\n", content_type="text/plain")
    site.routes["/b.md"] = Route("# Heading\n\n*x*\n", content_type="text/markdown")
    site.routes["/c"] = Route(
        "caf\xe9".encode("latin-1"), content_type="text/plain; charset=latin-1"
    )
    site.routes["/d.md"] = Route("# Guessed\n", content_type=None)
    batch = await load_sources([site.url(p) for p in ("/a.txt", "/b.md", "/c", "/d.md")])
    by_path = {urlsplit(d.uri).path: d for d in batch.documents}
    assert by_path["/a.txt"].content == "just text\n"
    assert by_path["/b.md"].content == "# Heading\n\n*x*\n"
    assert by_path["/b.md"].title == "Heading"
    assert by_path["/b.md"].metadata["content_type"] == "text/markdown"
    assert by_path["/c"].content == "café"
    assert by_path["/d.md"].metadata["content_type"] == "text/markdown"


async def test_redirect_gives_the_final_url(site: Site) -> None:
    site.routes["/old"] = Route(status=301, headers={"Location": "/new"})
    site.page("/new", "New")
    batch = await load_sources([site.url("/old#section")])
    assert uris(batch) == [site.url("/new")]
    assert batch.scopes == [Scope("exact", site.url("/old")), Scope("exact", site.url("/new"))]


@pytest.mark.parametrize("content_type", ["application/pdf", "image/png"])
async def test_non_text_content_is_refused(site: Site, content_type: str) -> None:
    site.routes["/file"] = Route(b"%PDF-1.7 \x00\x01", content_type=content_type)
    with pytest.raises(SourceError) as info:
        await load_sources([site.url("/file")])
    assert str(info.value).startswith(f"Not a text page: {site.url('/file')} is {content_type}")


async def test_binary_body_with_a_text_type_is_refused(site: Site) -> None:
    site.routes["/lie"] = Route(b"\x00\x01\x02", content_type="text/plain")
    with pytest.raises(SourceError, match=r"Not a text page: .*NUL bytes"):
        await load_sources([site.url("/lie")])


async def test_http_error_status(site: Site) -> None:
    with pytest.raises(SourceError) as info:
        await load_sources([site.url("/missing")])
    assert str(info.value) == f"HTTP 404 Not Found fetching {site.url('/missing')} (check the URL)"


async def test_http_error_after_redirect_names_both(site: Site) -> None:
    site.routes["/moved"] = Route(status=302, headers={"Location": "/broken"})
    site.routes["/broken"] = Route("oops", status=500)
    with pytest.raises(SourceError, match=r"HTTP 500 .*\(redirected to .*/broken\)"):
        await load_sources([site.url("/moved")])


async def test_connection_error(site: Site) -> None:
    url = f"http://127.0.0.1:{unused_port()}/x"
    with pytest.raises(
        SourceError, match=f"Could not fetch {url}: .*check the URL and the network"
    ):
        await load_sources([url])


async def test_timeout(site: Site) -> None:
    site.routes["/slow"] = Route("late", content_type="text/plain", delay=1.0)
    with pytest.raises(SourceError, match=r"Timed out after 0.2s fetching .*/slow"):
        await load_sources([site.url("/slow")], crawl=CrawlLimits(timeout=0.2))


async def test_a_given_client_is_used_and_left_open(site: Site) -> None:
    site.routes["/a"] = Route("a", content_type="text/plain")
    async with httpx.AsyncClient(headers={"X-Test": "1"}) as client:
        batch = await load_sources([site.url("/a"), site.url("/a")], http=client)
        assert not client.is_closed
    assert uris(batch) == [site.url("/a")]
    assert site.requests == ["/a"]


# ---------------------------------------------------------------------------
# crawls


@pytest.fixture
def docs_site(site: Site) -> Site:
    """/docs/ with six pages, a cycle, a link outside the prefix and a broken link.

    depth 0: /docs/           -> a, b, /blog/post (outside), a#frag, a?q=1
    depth 1: /docs/a          -> b, c (cycle back via b -> /docs/)
             /docs/b          -> /docs/, d
    depth 2: /docs/c          -> e
             /docs/d          -> broken (404)
    depth 3: /docs/e, /docs/broken
    """
    site.page("/docs/", "Home", "a", "b", "/blog/post", "a#frag", "a?q=1")
    site.page("/docs/a", "A", "b", "c")
    site.page("/docs/b", "B", "/docs/", "d")
    site.page("/docs/c", "C", "e")
    site.page("/docs/d", "D", "broken")
    site.page("/docs/e", "E")
    site.page("/blog/post", "Outside")
    return site


def paths(batch: SourceBatch) -> list[str]:
    return [urlsplit(uri).path for uri in uris(batch)]


async def test_crawl_follows_links_under_the_prefix(docs_site: Site) -> None:
    seen: list[str] = []
    batch = await load_sources(
        [docs_site.url("/docs/**")], on_document=lambda d: seen.append(urlsplit(d.uri).path)
    )
    assert paths(batch) == ["/docs/", "/docs/a", "/docs/b", "/docs/c", "/docs/d", "/docs/e"]
    assert seen[:3] == ["/docs/", "/docs/a", "/docs/b"]
    assert "/blog/post" not in docs_site.requests
    assert sorted(docs_site.requests) == sorted(set(docs_site.requests))  # each page once
    [failure] = batch.failures
    assert failure.uri == docs_site.url("/docs/broken")
    assert failure.reason.startswith("HTTP 404 Not Found")
    assert batch.scopes == [
        Scope("prefix", docs_site.url("/docs/")),
        Scope("exact", docs_site.url("/docs")),
    ]
    assert_owned(batch)
    home = batch.documents[0]
    assert home.title == "Home"
    assert "Text of Home." in home.content
    assert "/blog/post" not in home.content  # navigation is not content


async def test_crawl_max_depth(docs_site: Site) -> None:
    batch = await load_sources([docs_site.url("/docs/**")], crawl=CrawlLimits(max_depth=1))
    assert paths(batch) == ["/docs/", "/docs/a", "/docs/b"]
    # c and d were found but not visited: the crawl claims only what it loaded
    assert batch.scopes == [Scope("exact", uri) for uri in uris(batch)]
    batch = await load_sources([docs_site.url("/docs/**")], crawl=CrawlLimits(max_depth=0))
    assert paths(batch) == ["/docs/"]


async def test_crawl_max_pages(docs_site: Site) -> None:
    batch = await load_sources([docs_site.url("/docs/**")], crawl=CrawlLimits(max_pages=4))
    assert paths(batch) == ["/docs/", "/docs/a", "/docs/b", "/docs/c"]
    assert len(docs_site.requests) == 4
    assert batch.scopes == [Scope("exact", uri) for uri in uris(batch)]


async def test_crawl_concurrency_is_bounded(site: Site) -> None:
    links = [f"p{i}" for i in range(8)]
    site.page("/docs/", "Home", *links)
    for link in links:
        site.routes[f"/docs/{link}"] = Route("x", content_type="text/plain", delay=0.05)
    batch = await load_sources([site.url("/docs/**")], crawl=CrawlLimits(concurrency=2))
    assert len(batch.documents) == 9
    assert site.max_in_flight == 2


async def test_crawl_reports_non_text_pages_as_failures(site: Site) -> None:
    site.page("/docs/", "Home", "manual.pdf", "notes.txt")
    site.routes["/docs/manual.pdf"] = Route(b"%PDF", content_type="application/pdf")
    site.routes["/docs/notes.txt"] = Route("notes", content_type="text/plain")
    batch = await load_sources([site.url("/docs/**")])
    assert paths(batch) == ["/docs/", "/docs/notes.txt"]
    [failure] = batch.failures
    assert "is application/pdf" in failure.reason


async def test_crawl_start_page_failing_is_an_error(site: Site) -> None:
    with pytest.raises(SourceError) as info:
        await load_sources([site.url("/nothing/**")])
    assert str(info.value) == (
        f"Cannot crawl {site.url('/nothing/**')}: HTTP 404 Not Found fetching "
        f"{site.url('/nothing/')} (check the URL)"
    )


async def test_crawl_start_connection_error(site: Site) -> None:
    url = f"http://127.0.0.1:{unused_port()}/docs/**"
    with pytest.raises(SourceError, match=r"Cannot crawl .*: Could not fetch"):
        await load_sources([url])


async def test_crawl_start_server_error_is_not_retried(site: Site) -> None:
    site.routes["/docs/"] = Route("down", status=503)
    site.page("/docs", "Would be found")
    with pytest.raises(SourceError, match=r"Cannot crawl .*HTTP 503"):
        await load_sources([site.url("/docs/**")])
    assert site.requests == ["/docs/"]


async def test_crawl_starts_at_path_without_slash_when_only_that_exists(site: Site) -> None:
    site.page("/guide", "Guide", "/guide/one", "/guidebook")
    site.page("/guide/one", "One")
    site.page("/guidebook", "Not under the prefix")
    batch = await load_sources([site.url("/guide/**")])
    assert paths(batch) == ["/guide", "/guide/one"]
    assert_owned(batch)
    assert not any(scope.covers(site.url("/guidebook")) for scope in batch.scopes)


async def test_crawl_without_slash_fallback_failing_reports_the_first_error(site: Site) -> None:
    with pytest.raises(SourceError, match=r"fetching .*/gone/ \(check the URL\)"):
        await load_sources([site.url("/gone/**")])
    assert site.requests == ["/gone/", "/gone"]


async def test_crawl_of_a_site_root(site: Site) -> None:
    site.page("/", "Root", "/x")
    site.page("/x", "X")
    batch = await load_sources([site.url("/**")])
    assert paths(batch) == ["/", "/x"]
    assert batch.scopes == [Scope("prefix", site.url("/"))]


async def test_crawl_start_redirected_outside_the_prefix_is_an_error(site: Site) -> None:
    site.routes["/docs/"] = Route(status=302, headers={"Location": "/elsewhere/"})
    site.page("/elsewhere/", "Elsewhere")
    with pytest.raises(SourceError, match="outside the prefix"):
        await load_sources([site.url("/docs/**")])


async def test_crawl_skips_pages_redirected_outside_the_prefix(site: Site) -> None:
    site.page("/docs/", "Home", "moved", "kept")
    site.routes["/docs/moved"] = Route(status=302, headers={"Location": "/blog/x"})
    site.page("/blog/x", "Blog", "/docs/secret")
    site.page("/docs/kept", "Kept")
    site.page("/docs/secret", "Only linked from outside")
    batch = await load_sources([site.url("/docs/**")])
    assert paths(batch) == ["/docs/", "/docs/kept"]
    assert batch.failures == []
    assert "/docs/secret" not in site.requests


async def test_crawl_and_page_specs_share_documents(docs_site: Site) -> None:
    batch = await load_sources([docs_site.url("/docs/a"), docs_site.url("/docs/**")])
    assert paths(batch) == [
        "/docs/a",
        "/docs/",
        "/docs/b",
        "/docs/c",
        "/docs/d",
        "/docs/e",
    ]


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"max_pages": 0}, "CrawlLimits.max_pages is 0 (it must be at least 1)"),
        ({"max_depth": -1}, "CrawlLimits.max_depth is -1 (it must be at least 0)"),
        ({"concurrency": 0}, "CrawlLimits.concurrency is 0 (it must be at least 1)"),
        ({"timeout": 0}, "CrawlLimits.timeout is 0 (it must be positive)"),
    ],
)
def test_crawl_limits_are_validated(limits: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        CrawlLimits(**limits)  # type: ignore[arg-type]
    assert str(info.value) == message
