"""Readable text from raw bytes: decoding, HTML to Markdown, and titles.

Shared by the file and web loaders so a page reads the same whether it was
fetched or saved to disk. HTML keeps its structure as Markdown (headings as
`#`, lists, tables, code) because the chunker splits on it; page chrome
(scripts, styles, navigation, site header and footer) is dropped because it
repeats on every page and drowns retrieval.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from urllib.parse import urljoin

from bs4 import BeautifulSoup, Tag
from markdownify import MarkdownConverter

from haiku.rag.sources.spec import normalize_url

DROPPED_TAGS = ("script", "style", "noscript", "template", "nav", "iframe", "svg", "button")
PAGE_CHROME = ("header", "footer")  # dropped unless inside an <article> or <main>

_CONVERTER = MarkdownConverter(
    heading_style="ATX",
    bullets="-",
    strip=["img"],
    escape_asterisks=False,
    escape_underscores=False,
)
_HEADING = re.compile(r"^ {0,3}#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


@dataclass(frozen=True)
class HtmlPage:
    """What a page gives us: its readable text, its title, and the pages it links to."""

    title: str | None
    markdown: str
    links: tuple[str, ...]


def decode_text(data: bytes, charset: str | None = None) -> str:
    """Bytes to text with Unix newlines; raises ValueError (with the reason) when it isn't text.

    A BOM wins over `charset`; without either the text must be UTF-8. NUL bytes mean binary.
    """
    if data.startswith(codecs.BOM_UTF8):
        data, charset = data[len(codecs.BOM_UTF8) :], "utf-8"
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        charset = "utf-16"
    encoding = charset or "utf-8"
    if b"\x00" in data and not encoding.lower().replace("-", "").startswith(("utf16", "utf32")):
        raise ValueError("it contains NUL bytes, so it looks binary")
    try:
        return normalize_newlines(data.decode(encoding))
    except (UnicodeDecodeError, LookupError):
        raise ValueError(f"it is not valid {encoding} text") from None


def normalize_newlines(text: str) -> str:
    """As Python's text mode reads files, so content hashes don't depend on the platform."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def markdown_title(text: str) -> str | None:
    """The first level-1 ATX heading (`# Title`) outside code fences."""
    in_fence = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (match := _HEADING.match(line)):
            return match.group(1).strip()
    return None


def html_to_markdown(
    html: str | bytes, *, base_url: str | None = None, encoding: str | None = None
) -> HtmlPage:
    """Convert a page; links are absolute (against `base_url`) and normalised for crawling."""
    if isinstance(html, bytes):
        if b"\x00" in html:
            raise ValueError("it contains NUL bytes, so it looks binary")
        soup = BeautifulSoup(html, "html.parser", from_encoding=encoding)
    else:
        soup = BeautifulSoup(html, "html.parser")
    base = _base_url(soup, base_url)
    links = _links(soup, base) if base else ()
    head_title = _text(soup.title)
    _drop_chrome(soup)
    root = soup.find("main") or soup.body or soup
    title = _text(root.find("h1")) or head_title
    markdown = _tidy(_CONVERTER.convert_soup(root))
    return HtmlPage(title=title, markdown=markdown, links=links)


def _base_url(soup: BeautifulSoup, base_url: str | None) -> str | None:
    """A `<base href>` redirects relative links; honour it."""
    tag = soup.find("base", href=True)
    if base_url and isinstance(tag, Tag):
        return urljoin(base_url, str(tag["href"]))
    return base_url


def _links(soup: BeautifulSoup, base: str) -> tuple[str, ...]:
    """Absolute http(s) links in document order, without duplicates; hrefs rewritten in place."""
    found: dict[str, None] = {}
    for anchor in soup.find_all("a", href=True):
        absolute = urljoin(base, str(anchor["href"]).strip())
        anchor["href"] = absolute
        if absolute.lower().startswith(("http://", "https://")):
            found.setdefault(normalize_url(absolute), None)
    return tuple(found)


def _drop_chrome(soup: BeautifulSoup) -> None:
    for tag in soup.find_all(DROPPED_TAGS):
        tag.decompose()
    for tag in soup.find_all(PAGE_CHROME):
        if tag.find_parent(("article", "main")) is None:
            tag.decompose()


def _text(tag: object) -> str | None:
    if not isinstance(tag, Tag):
        return None
    text = " ".join(tag.get_text(" ").split())
    return text or None


def _tidy(markdown: str) -> str:
    """Trailing spaces off, at most one blank line in a row, no blank edges."""
    lines = [line.rstrip() for line in normalize_newlines(markdown).split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
