"""Source specs to documents: files, directories, globs, web pages and site crawls.

`load_sources` is the entry point; the package README gives the spec grammar,
the invariants, and how to add another kind of source.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urldefrag

import httpx

from haiku.rag.documents import Document
from haiku.rag.errors import SourceError
from haiku.rag.sources import web
from haiku.rag.sources.files import FilePlan, plan_files, read_file_document
from haiku.rag.sources.loaders import (
    CommandPolicy,
    LoaderPlan,
    check_command_allowed,
    plan_loader,
    run_command,
    run_loader,
)
from haiku.rag.sources.spec import (
    CommandSpec,
    CrawlSpec,
    LoaderSpec,
    Scope,
    SourceFailure,
    Spec,
    UrlSpec,
    parse_spec,
    split_specs,
)
from haiku.rag.sources.web import CrawlLimits

__all__ = [
    "CommandPolicy",
    "CrawlLimits",
    "Scope",
    "SourceBatch",
    "SourceFailure",
    "load_sources",
]

USER_AGENT = "haiku.rag"


@dataclass
class SourceBatch:
    """What a list of specs loaded.

    `scopes` say which uris the specs own. A stored document whose uri a scope
    covers but which is in neither `documents` nor `failures` has disappeared
    from its source; a uri in `failures` is still there, just unreadable now.
    """

    documents: list[Document]
    failures: list[SourceFailure]
    scopes: list[Scope]


@dataclass
class _Collector:
    """Gathers results across specs: each uri once, sorted by uri within a spec."""

    on_document: Callable[[Document], None] | None
    documents: list[Document] = field(default_factory=list)
    failures: dict[str, SourceFailure] = field(default_factory=dict)
    scopes: list[Scope] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)
    _spec: list[Document] = field(default_factory=list)

    def has(self, uri: str) -> bool:
        return uri in self._seen

    def take(self, item: Document | SourceFailure) -> None:
        if isinstance(item, SourceFailure):
            self.failures.setdefault(item.uri, item)
        elif item.uri not in self._seen:
            self._seen.add(item.uri)
            self._spec.append(item)
            if self.on_document is not None:
                self.on_document(item)

    def end_spec(self) -> None:
        self.documents.extend(sorted(self._spec, key=lambda document: document.uri))
        self._spec = []

    def batch(self) -> SourceBatch:
        scopes = list(dict.fromkeys(self.scopes))
        return SourceBatch(self.documents, list(self.failures.values()), scopes)


async def load_sources(
    specs: Sequence[str],
    *,
    http: httpx.AsyncClient | None = None,
    crawl: CrawlLimits = CrawlLimits(),  # noqa: B008 (frozen, safe to share)
    on_document: Callable[[Document], None] | None = None,
    commands: CommandPolicy = CommandPolicy(),  # noqa: B008 (frozen, safe to share)
) -> SourceBatch:
    """Load every spec; raises SourceError for a spec that names nothing loadable.

    Local specs are all resolved before anything is read or fetched, so a typo
    fails fast. `on_document` sees each document once, as it loads. A client you
    pass in is used (not closed), with redirects followed and `crawl.timeout` on
    every request; otherwise one is made for web specs. `commands` holds the
    document loaders (`name:input` specs, files with a loader's extension) and
    whether `` `cmd` `` specs may run: by default there are no loaders and
    commands are refused (see `sources/loaders.py`).
    """
    parsed = [parse_spec(text, commands.loaders) for text in split_specs(specs)]
    if not parsed:
        raise SourceError("No source given (pass a path, a glob or an http(s) URL)")
    plans = [await _plan(spec, commands) for spec in parsed]
    out = _Collector(on_document)
    needs_web = any(isinstance(plan, UrlSpec | CrawlSpec) for plan in plans)
    async with _client(http, crawl, needed=needs_web) as client:
        for plan in plans:
            if isinstance(plan, FilePlan):
                await _load_files(plan, out, commands)
            elif isinstance(plan, UrlSpec):
                await _load_page(_required(client), plan, crawl, out)
            elif isinstance(plan, CrawlSpec):
                out.scopes.extend(await web.crawl(_required(client), plan, crawl, out.take))
            elif isinstance(plan, LoaderPlan):
                await _load_with_loader(plan, commands, out)
            else:
                await _load_command(plan, commands, out)
            out.end_spec()
    return out.batch()


async def _plan(
    spec: Spec, commands: CommandPolicy
) -> FilePlan | UrlSpec | CrawlSpec | LoaderPlan | CommandSpec:
    if isinstance(spec, UrlSpec | CrawlSpec):
        return spec
    if isinstance(spec, CommandSpec):
        check_command_allowed(spec, commands)
        return spec
    if isinstance(spec, LoaderSpec):
        return await asyncio.to_thread(plan_loader, spec, commands)
    return await asyncio.to_thread(plan_files, spec, commands.suffixes)


@asynccontextmanager
async def _client(
    http: httpx.AsyncClient | None, limits: CrawlLimits, *, needed: bool
) -> AsyncIterator[httpx.AsyncClient | None]:
    """The caller's client, or our own (closed afterwards) when a web spec needs one."""
    if http is not None or not needed:
        yield http
        return
    async with httpx.AsyncClient(
        headers={"User-Agent": USER_AGENT}, timeout=limits.timeout, follow_redirects=True
    ) as client:
        yield client


def _required(client: httpx.AsyncClient | None) -> httpx.AsyncClient:
    if client is None:  # pragma: no cover - _client makes one whenever a web spec exists
        raise RuntimeError("no HTTP client for a web spec")
    return client


async def _load_files(plan: FilePlan, out: _Collector, commands: CommandPolicy) -> None:
    out.scopes.extend(plan.scopes)
    for failure in plan.failures:
        out.take(failure)
    for path in plan.paths:
        if out.has(path.as_uri()):
            continue
        loader = commands.loader_for(path) if commands.loaders else None
        try:
            if loader is None:
                documents = [await asyncio.to_thread(read_file_document, path)]
            else:
                documents = await asyncio.to_thread(
                    run_loader,
                    loader,
                    str(path),
                    uri=path.as_uri(),
                    file=path,
                    timeout=commands.timeout,
                )
        except SourceError as exc:
            if plan.strict:
                raise
            out.take(SourceFailure(path.as_uri(), str(exc)))
            continue
        if loader is not None and plan.strict:  # the file owns its JSON entries
            out.scopes.append(Scope("prefix", path.as_uri() + "#"))
        for document in documents:
            out.take(document)


async def _load_with_loader(plan: LoaderPlan, commands: CommandPolicy, out: _Collector) -> None:
    """`name:input`: one run of the loader; any failure is the spec's (it names one thing)."""
    out.scopes.extend(plan.scopes)
    documents = await asyncio.to_thread(
        run_loader,
        plan.loader,
        plan.argument,
        uri=plan.uri,
        file=plan.file,
        timeout=commands.timeout,
    )
    for document in documents:
        out.take(document)


async def _load_command(spec: CommandSpec, commands: CommandPolicy, out: _Collector) -> None:
    document = await asyncio.to_thread(run_command, spec.command, timeout=commands.timeout)
    out.scopes.append(Scope("exact", document.uri))
    out.take(document)


async def _load_page(
    client: httpx.AsyncClient, spec: UrlSpec, limits: CrawlLimits, out: _Collector
) -> None:
    """One page: owns the url asked for and the url it ended at (they differ after a redirect)."""
    requested = urldefrag(spec.url).url
    out.scopes.append(Scope("exact", requested))
    if out.has(requested):
        return
    fetched = await web.fetch_page(client, spec.url, timeout=limits.timeout)
    out.scopes.append(Scope("exact", fetched.document.uri))
    out.take(fetched.document)
