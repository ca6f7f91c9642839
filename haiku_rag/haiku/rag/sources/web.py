"""Web sources: one page, or a bounded breadth-first crawl under a url prefix.

Bodies are streamed so a non-text response (a PDF, an image) is refused from its
headers without downloading it. A crawl proceeds level by level, so which pages
it loads depends on the site, not on which response happened to arrive first.
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urldefrag, urlsplit

import httpx

from haiku.rag.documents import Document
from haiku.rag.errors import ConfigError, SourceError
from haiku.rag.sources.html import decode_text, html_to_markdown, markdown_title
from haiku.rag.sources.spec import CrawlSpec, Scope, SourceFailure, normalize_url

logger = logging.getLogger(__name__)

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
TEXT_APPLICATION_TYPES = frozenset({"application/json", "application/xml", "application/markdown"})


@dataclass(frozen=True)
class CrawlLimits:
    """Bounds of a crawl, and the timeout (seconds) of every request, crawl or not.

    The start page is depth 0; `max_depth=0` loads only it. `max_pages` counts
    every page requested, including those that fail.
    """

    max_pages: int = 50
    max_depth: int = 3
    concurrency: int = 4
    timeout: float = 20.0

    def __post_init__(self) -> None:
        for name, value, least in (
            ("max_pages", self.max_pages, 1),
            ("max_depth", self.max_depth, 0),
            ("concurrency", self.concurrency, 1),
        ):
            if value < least:
                raise ConfigError(f"CrawlLimits.{name} is {value} (it must be at least {least})")
        if self.timeout <= 0:
            raise ConfigError(f"CrawlLimits.timeout is {self.timeout} (it must be positive)")


@dataclass(frozen=True)
class Fetched:
    """A loaded page and the (normalised, absolute) links on it."""

    document: Document
    links: tuple[str, ...] = ()


class HttpStatusError(SourceError):
    """The server answered with an error status; kept apart so a crawl can retry `/path`."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def is_text_type(content_type: str) -> bool:
    return (
        content_type.startswith("text/")
        or content_type in HTML_TYPES
        or content_type in TEXT_APPLICATION_TYPES
    )


async def fetch_page(client: httpx.AsyncClient, url: str, *, timeout: float) -> Fetched:
    """GET one page (following redirects) into a Document whose uri is the final url."""
    try:
        async with client.stream("GET", url, follow_redirects=True, timeout=timeout) as response:
            final = urldefrag(str(response.url)).url
            if response.is_error:
                moved = f" (redirected to {final})" if final != urldefrag(url).url else ""
                raise HttpStatusError(
                    f"HTTP {response.status_code} {response.reason_phrase} fetching {url}{moved}"
                    " (check the URL)",
                    response.status_code,
                )
            content_type = _content_type(response, final)
            if not is_text_type(content_type):
                raise SourceError(
                    f"Not a text page: {final} is {content_type}"
                    " (only HTML and text pages can be loaded; convert it to text or use a loader)"
                )
            body = await response.aread()
    except httpx.TimeoutException:
        raise SourceError(
            f"Timed out after {timeout:g}s fetching {url} (check the URL, or raise the timeout)"
        ) from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        reason = str(exc) or type(exc).__name__
        raise SourceError(
            f"Could not fetch {url}: {reason} (check the URL and the network)"
        ) from None
    # parsing a large page takes a while: keep the event loop (and other fetches) going
    charset = response.charset_encoding
    return await asyncio.to_thread(page_document, final, content_type, body, charset=charset)


def _content_type(response: httpx.Response, url: str) -> str:
    """The media type, lower-cased; guessed from the url when the server sends none."""
    header = response.headers.get("content-type", "")
    media = header.split(";", 1)[0].strip().lower()
    return media or mimetypes.guess_type(urlsplit(url).path)[0] or "text/plain"


def page_document(url: str, content_type: str, body: bytes, *, charset: str | None) -> Fetched:
    """Turn a response body into a Document (HTML as Markdown) plus the links it holds."""
    try:
        if content_type in HTML_TYPES:
            page = html_to_markdown(body, base_url=url, encoding=charset)
            text, title, links = page.markdown, page.title, page.links
        else:
            text = decode_text(body, charset)
            title, links = markdown_title(text), ()
    except ValueError as exc:
        raise SourceError(f"Not a text page: {url} ({exc})") from None
    document = Document.from_text(
        text,
        uri=url,
        title=title or url_title(url),
        metadata={"source": "web", "url": url, "content_type": content_type},
    )
    return Fetched(document, links)


def url_title(url: str) -> str:
    """The last path segment (`guide` for `/docs/guide/`), else the host."""
    parts = urlsplit(url)
    segments = [segment for segment in parts.path.split("/") if segment]
    return unquote(segments[-1]) if segments else parts.hostname or url


def _in_prefix(url: str, prefix: str) -> bool:
    """Under `https://host/path/`, or `https://host/path` itself."""
    url = normalize_url(url)
    return url.startswith(prefix) or url == prefix.rstrip("/")


async def crawl(
    client: httpx.AsyncClient,
    spec: CrawlSpec,
    limits: CrawlLimits,
    emit: Callable[[Document | SourceFailure], None],
) -> list[Scope]:
    """Load pages under `spec.prefix` breadth first, handing each result to `emit`.

    Raises SourceError when the start page fails; later failures are emitted.
    Returns what the crawl owns: the whole prefix when it saw every page it
    found, else only the pages it loaded (so a bounded crawl of a large site
    never claims, and prunes, pages it simply did not reach).
    """
    prefix = spec.prefix
    semaphore = asyncio.Semaphore(limits.concurrency)

    async def visit(url: str) -> Fetched | SourceFailure:
        async with semaphore:
            try:
                return await fetch_page(client, url, timeout=limits.timeout)
            except SourceError as exc:
                return SourceFailure(url, str(exc))

    results: list[Fetched | SourceFailure] = [await _fetch_start(client, spec, limits.timeout)]
    queued = {prefix, prefix.rstrip("/")}
    loaded: list[str] = []
    pages, depth, truncated = 1, 0, False
    while True:
        frontier: list[str] = []
        for result in results:
            if isinstance(result, SourceFailure):
                emit(result)
                continue
            uri = result.document.uri
            queued.add(normalize_url(uri))
            if not _in_prefix(uri, prefix):
                logger.info("crawl of %s: skipping %s, redirected outside the prefix", prefix, uri)
                continue
            emit(result.document)
            loaded.append(uri)
            for link in result.links:
                if link not in queued and _in_prefix(link, prefix):
                    queued.add(link)
                    frontier.append(link)
        if not frontier:
            break
        if depth >= limits.max_depth or pages >= limits.max_pages:
            truncated = True
            break
        batch = frontier[: limits.max_pages - pages]
        truncated = truncated or len(batch) < len(frontier)
        pages, depth = pages + len(batch), depth + 1
        results = list(await asyncio.gather(*(visit(url) for url in batch)))
    if truncated:
        return [Scope("exact", uri) for uri in loaded]
    bare = prefix.rstrip("/")
    exact = [Scope("exact", bare)] if urlsplit(bare).path else []
    return [Scope("prefix", prefix), *exact]


async def _fetch_start(client: httpx.AsyncClient, spec: CrawlSpec, timeout: float) -> Fetched:
    """The prefix page, or the same path without its slash when only that exists."""
    start = await _fetch_start_page(client, spec, timeout)
    if not _in_prefix(start.document.uri, spec.prefix):
        raise SourceError(
            f"Cannot crawl {spec.raw}: {spec.prefix} redirects to {start.document.uri},"
            " outside the prefix (crawl that url's directory instead)"
        )
    return start


async def _fetch_start_page(client: httpx.AsyncClient, spec: CrawlSpec, timeout: float) -> Fetched:
    prefix = spec.prefix
    try:
        return await fetch_page(client, prefix, timeout=timeout)
    except HttpStatusError as first:
        bare = prefix.rstrip("/")
        if first.status not in (404, 410) or not urlsplit(bare).path:
            raise SourceError(f"Cannot crawl {spec.raw}: {first}") from None
        try:
            return await fetch_page(client, bare, timeout=timeout)
        except SourceError:
            raise SourceError(f"Cannot crawl {spec.raw}: {first}") from None
    except SourceError as exc:
        raise SourceError(f"Cannot crawl {spec.raw}: {exc}") from None
