"""The `haiku-rag` command line: the client's operations, with progress bars and tables.

Output meant for pipes (results, `--json`) goes to stdout; progress and errors
go to stderr. An error prints one line and exits non-zero; `-v` adds the traceback.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.progress import Progress as RichProgress
from rich.table import Table
from rich.text import Text

from haiku.rag.client import DB_ENV, HaikuRAG, StoreInfo
from haiku.rag.config import AppConfig, load_config
from haiku.rag.documents import SearchResult
from haiku.rag.errors import HaikuRAGError
from haiku.rag.rags import (
    DEFAULT_DRIVER,
    DRIVER_CHOICES,
    RagSummary,
    describe_rags,
    find_rag,
    rags_dir,
)

app = typer.Typer(
    name="haiku-rag",
    help="Build a knowledge base from your documents and search it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

T = TypeVar("T")


@dataclass
class Options:
    db: Path | None
    config_path: Path | None
    verbose: bool
    rag: str | None = None
    """`--rag NAME`: a named knowledge base in the rags dir (never set together with db)."""
    driver: str | None = None
    """`--driver`: the driver of a store being created (skips the question for --rag)."""

    def config(self) -> AppConfig:
        return load_config(self.config_path)


@app.callback()
def _global(
    ctx: typer.Context,
    db: Annotated[
        Path | None,
        typer.Option("--db", envvar=DB_ENV, help="Knowledge base path (default: the data dir)."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="Config file (default: HAIKU_RAG_CONFIG, ./haiku.rag.yaml)."),
    ] = None,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Tracebacks on errors.")] = False,
    rag: Annotated[
        str | None,
        typer.Option("--rag", help="A named knowledge base in the rags dir (see `rags`)."),
    ] = None,
    driver: Annotated[
        str | None,
        typer.Option(
            "--driver",
            help="Driver for a new knowledge base: lancedb (default), yaml or duckdb.",
        ),
    ] = None,
) -> None:
    if rag is not None and db is not None:
        source = ctx.get_parameter_source("db")
        if getattr(source, "name", None) != "ENVIRONMENT":
            _error("--rag and --db both name a knowledge base: pass only one")
            raise typer.Exit(2)
        db = None  # --rag on the command line wins over HAIKU_RAG_DB
    ctx.obj = Options(db=db, config_path=config, verbose=verbose, rag=rag, driver=driver)


def _error(message: str) -> None:
    """One line on stderr; the message is plain text (no rich markup: it may hold brackets)."""
    err.print(Text.assemble(("Error: ", "bold red"), message), highlight=False)


def _run(ctx: typer.Context, work: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine; turn any failure into one line on stderr and a non-zero exit."""
    options: Options = ctx.obj
    try:
        return asyncio.run(work())  # type: ignore[arg-type]
    except HaikuRAGError as error:
        if options.verbose:
            traceback.print_exc()
        _error(str(error))
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err.print("Interrupted.")
        raise typer.Exit(130) from None
    except Exception as error:
        if options.verbose:
            traceback.print_exc()
        _error(f"{type(error).__name__}: {error}")
        raise typer.Exit(1) from None


def _client(ctx: typer.Context, *, create: bool = False, read_only: bool = False) -> HaikuRAG:
    """The knowledge base the global options name: --rag NAME, --db PATH or the default."""
    options: Options = ctx.obj
    config = options.config()
    if options.rag is None:
        return HaikuRAG(
            options.db, config, create=create, read_only=read_only, driver=options.driver
        )
    driver = options.driver
    if create and not read_only and driver is None and find_rag(options.rag, config) is None:
        driver = _ask_driver(options.rag, config)
    return HaikuRAG.named(options.rag, config, create=create, driver=driver, read_only=read_only)


def _stdin_is_tty() -> bool:
    return sys.stdin.isatty()


def _ask_driver(name: str, config: AppConfig) -> str:
    """Ask which driver a new named knowledge base gets; scripts (no TTY) take the default."""
    default = config.storage.driver or DEFAULT_DRIVER
    if default not in DRIVER_CHOICES or not _stdin_is_tty():
        return default
    question = f"New knowledge base {name!r} in {rags_dir(config)}: driver"
    while True:
        answer = str(
            typer.prompt(f"{question} ({', '.join(DRIVER_CHOICES)})", default=default, err=True)
        ).strip()
        if answer in DRIVER_CHOICES:
            return answer
        err.print(f"Choose one of {', '.join(DRIVER_CHOICES)}.", highlight=False)


class BarProgress:
    """The client's Progress hooks drawn as rich progress bars on stderr."""

    def __init__(self, progress: RichProgress) -> None:
        self._progress = progress
        self._tasks: dict[str, TaskID] = {}

    def start(self, task: str, total: int) -> None:
        if total == 0 and task not in self._tasks:
            return  # nothing to do: no empty bar
        if task in self._tasks:
            self._progress.update(self._tasks[task], total=total, completed=0)
        else:
            self._tasks[task] = self._progress.add_task(task, total=total)

    def advance(self, task: str, amount: int = 1) -> None:
        if task in self._tasks:
            self._progress.advance(self._tasks[task], amount)


@contextmanager
def _bars() -> Iterator[BarProgress]:
    with RichProgress(
        TextColumn("{task.description:>9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as progress:
        yield BarProgress(progress)


@app.command()
def add(
    ctx: typer.Context,
    sources: Annotated[
        list[str],
        typer.Argument(
            help="Files, directories, globs ('docs/**/*.md'), URLs, 'a;b' lists, "
            "LOADER:INPUT (document_loaders), '`command`' (its output)."
        ),
    ],
    prune: Annotated[
        bool,
        typer.Option(help="Delete documents that a directory or glob source no longer holds."),
    ] = True,
) -> None:
    """Build or update the knowledge base: only new or changed documents are embedded."""

    async def work() -> int:
        async with _client(ctx, create=True) as kb:
            with _bars() as bars:
                # the user typed these specs, so `cmd` sources may run
                report = await kb.add(*sources, prune=prune, progress=bars, allow_commands=True)
        for failure in report.failed:
            err.print(Text.assemble(("failed ", "yellow"), f"{failure.uri}: {failure.reason}"))
        out.print(report.summary(), highlight=False)
        return 1 if report.failed else 0

    raise typer.Exit(_run(ctx, work))


def _result_row(result: SearchResult) -> dict[str, Any]:
    return result.model_dump(mode="json")


@app.command()
def search(
    ctx: typer.Context,
    query: Annotated[str, typer.Argument(help="What to look for.")],
    top_k: Annotated[int | None, typer.Option("--top-k", "-k", min=1)] = None,
    filter: Annotated[
        str | None, typer.Option("--filter", help="Only documents whose uri matches this glob.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print results as JSON.")] = False,
    explain: Annotated[
        bool,
        typer.Option("--explain", help="Show each result's rank in every signal (vector, ...)."),
    ] = False,
) -> None:
    """Hybrid search (vector + BM25, + graph when there is one, fused by RRF); no LLM needed."""

    async def work() -> list[SearchResult]:
        async with _client(ctx, read_only=True) as kb:
            return await kb.search(query, top_k=top_k, filter=filter)

    results = _run(ctx, work)
    if as_json:
        out.print_json(json.dumps([_result_row(result) for result in results]))
        return
    if not results:
        out.print("No results.")
        return
    table = Table(show_lines=True)
    table.add_column("#", justify="right")
    table.add_column("score", justify="right")
    if explain:
        table.add_column("signal ranks")
    table.add_column("source")
    table.add_column("text")
    signals = _signal_names(results)
    for result in results:
        source = result.document_title or result.document_uri
        headings = list(result.headings)
        if headings and headings[0] == result.document_title:
            headings = headings[1:]  # the document's H1 is its title, already shown
        if headings:
            source += "\n" + " > ".join(headings)
        snippet = " ".join(result.content.split())
        ranks = [_signal_ranks(result, signals)] if explain else []
        table.add_row(
            str(result.rank),
            f"{result.score:.4f}",
            *ranks,
            f"{source}\n[dim]{result.document_uri}[/dim]\nchunk {result.chunk_id}",
            snippet[:400] + ("..." if len(snippet) > 400 else ""),
        )
    out.print(table)


_SIGNAL_ORDER = ("vector", "bm25", "graph")


def _signal_names(results: list[SearchResult]) -> list[str]:
    """Every signal that ranked any result, the built-in ones first."""
    seen = {name for result in results for name in result.signal_ranks}
    return [name for name in _SIGNAL_ORDER if name in seen] + sorted(seen - set(_SIGNAL_ORDER))


def _signal_ranks(result: SearchResult, signals: list[str]) -> str:
    """One line per signal: its 1-based rank of this chunk, `-` when it did not return it."""
    return "\n".join(f"{name} {result.signal_ranks.get(name, '-')}" for name in signals)


@app.command("graph")
def graph_command(
    ctx: typer.Context,
    top: Annotated[int, typer.Option("--top", "-n", min=1, help="Entities to list.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Show the knowledge graph: entity and relationship counts, the most connected entities."""

    async def work() -> Any:
        async with _client(ctx, read_only=True) as kb:
            return await kb.graph_stats(top)

    stats = _run(ctx, work)
    if stats is None:
        _error("This knowledge base's driver keeps no knowledge graph")
        raise typer.Exit(1)
    if as_json:
        out.print_json(json.dumps(asdict(stats)))
        return
    if not stats.entities:
        out.print(
            "No knowledge graph yet: set graph.extractor_model in the config, then run "
            "`haiku-rag add` (or `haiku-rag rebuild` for documents already stored).",
            highlight=False,
            markup=False,
        )
        return
    out.print(
        f"{stats.entities} entities, {stats.relationships} relationships, "
        f"from {stats.chunks} chunks of {stats.documents} documents",
        highlight=False,
    )
    table = Table()
    for column in ("entity", "type", "degree", "mentions", "description"):
        table.add_column(column, justify="right" if column in ("degree", "mentions") else "left")
    for entity in stats.top:
        table.add_row(
            Text(entity.name),
            entity.type,
            str(entity.degree),
            str(entity.mentions),
            Text(entity.descriptions[0] if entity.descriptions else ""),
        )
    out.print(table)


@app.command("list")
def list_documents(
    ctx: typer.Context,
    limit: Annotated[int | None, typer.Option(min=1)] = None,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List stored documents."""

    async def work() -> list[Any]:
        async with _client(ctx, read_only=True) as kb:
            return await kb.list_documents(limit=limit, offset=offset)

    documents = _run(ctx, work)
    if as_json:
        rows = [doc.model_dump(mode="json", exclude={"content"}) for doc in documents]
        out.print_json(json.dumps(rows))
        return
    table = Table()
    for column in ("id", "title", "uri", "updated"):
        table.add_column(column)
    for doc in documents:
        table.add_row(doc.id, doc.title or "", doc.uri, f"{doc.updated_at:%Y-%m-%d %H:%M}")
    out.print(table)


@app.command()
def get(
    ctx: typer.Context,
    document: Annotated[str, typer.Argument(help="Document id, uri or file path.")],
) -> None:
    """Print a stored document."""

    async def work() -> Any:
        async with _client(ctx, read_only=True) as kb:
            found = await kb.get_document(document)
        if found is None:
            raise HaikuRAGError(f"No document {document!r} in the knowledge base (see `list`)")
        return found

    found = _run(ctx, work)
    err.print(f"[bold]{found.title or found.uri}[/bold]  {found.uri}  id {found.id}")
    sys.stdout.write(found.content + ("" if found.content.endswith("\n") else "\n"))


@app.command()
def delete(
    ctx: typer.Context,
    document: Annotated[str, typer.Argument(help="Document id, uri or file path.")],
) -> None:
    """Delete a document and its chunks."""

    async def work() -> bool:
        async with _client(ctx) as kb:
            return await kb.delete_document(document)

    if not _run(ctx, work):
        _error(f"No document {document!r} in the knowledge base (see `list`)")
        raise typer.Exit(1)
    out.print(f"Deleted {document}")


@app.command()
def rebuild(ctx: typer.Context) -> None:
    """Re-chunk and re-embed every document (with the chunk size the store was created with)."""

    async def work() -> int:
        async with _client(ctx) as kb:
            with _bars() as bars:
                return await kb.rebuild(progress=bars)

    out.print(f"Rebuilt: {_run(ctx, work)} chunks embedded")


_INFO_WIDTH = max(len(item.name) for item in fields(StoreInfo))


@app.command()
def rags(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as JSON.")] = False,
) -> None:
    """List the named knowledge bases (--rag NAME): name, driver, documents, chunks, size."""
    options: Options = ctx.obj

    async def work() -> tuple[Path, list[RagSummary]]:
        config = options.config()
        return rags_dir(config), await asyncio.to_thread(describe_rags, config)

    directory, summaries = _run(ctx, work)
    if as_json:
        out.print_json(json.dumps([summary.as_dict() for summary in summaries]))
        return
    if not summaries:
        out.print(
            f"No knowledge bases in {directory}; make one with: haiku-rag --rag NAME add SOURCES",
            highlight=False,
            markup=False,
        )
        return
    table = Table(title=Text(str(directory)), title_justify="left")
    for column in ("name", "driver", "documents", "chunks", "size"):
        table.add_column(column, justify="right" if column in ("documents", "chunks") else "left")
    for summary in summaries:
        table.add_row(
            Text(summary.name),
            summary.driver or "?",
            "?" if summary.documents is None else str(summary.documents),
            "?" if summary.chunks is None else str(summary.chunks),
            _human_size(summary.size) if summary.driver != "qdrant" else "remote",
        )
    out.print(table)
    for summary in summaries:
        if summary.error:
            err.print(Text.assemble((f"{summary.name}: ", "yellow"), summary.error))


def _human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


@app.command()
def info(ctx: typer.Context) -> None:
    """Show the knowledge base: path, driver, counts, embedding model, config in use.

    The first line is `rags_dir <path>`, printed before the store is opened, so
    `haiku-rag info | grep rags_dir | awk '{print $2}'` works even with no store yet.
    """
    options: Options = ctx.obj

    async def work() -> Any:
        line = f"{'rags_dir':<{_INFO_WIDTH}}  {rags_dir(options.config())}"
        out.print(line, highlight=False, markup=False)
        async with _client(ctx, read_only=True) as kb:
            return await kb.info()

    details = asdict(_run(ctx, work))
    extra = details.pop("extra")
    details["signals"] = ", ".join(details["signals"])
    details["config_file"] = details["config_file"] or "(defaults)"
    if "chunk_size_reason" in extra:
        details["chunk_size"] = f"{details['chunk_size']} ({extra.pop('chunk_size_reason')})"
    details.update(extra)
    width = max(_INFO_WIDTH, *(len(key) for key in details))
    for key, value in details.items():
        out.print(f"{key:<{width}}  {value}", highlight=False)


@app.command()
def ask(
    ctx: typer.Context,
    question: Annotated[
        list[str] | None,
        typer.Argument(help="The question (words are joined); after `--` when it follows --file."),
    ] = None,
    filter: Annotated[
        str | None, typer.Option("--filter", help="Only documents whose uri matches this glob.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Chat model, e.g. openai:gpt-5 (default: qa.model)."),
    ] = None,
    files: Annotated[
        list[str] | None,
        typer.Option(
            "--file",
            help="Answer from this source only, in a throwaway knowledge base (repeatable; "
            "paths, globs, URLs, `cmd`). With no question, one --file is the question.",
        ),
    ] = None,
    inject: Annotated[
        bool,
        typer.Option(
            "--inject",
            help="Send the retrieved context with the question (rag_template) instead of "
            "letting the model search and cite.",
        ),
    ] = False,
) -> None:
    """Answer a question from the knowledge base, with numbered sources (needs a chat model).

    `ask --file DOC [--file DOC ...] -- question` answers from those documents only.
    """
    options: Options = ctx.obj

    async def work() -> tuple[str, list[Any]]:
        from haiku.rag.ephemeral import ask_ephemeral, question_and_sources

        config = options.config()
        text, sources = await question_and_sources(
            question or [], files or [], config, allow_commands=True
        )
        if sources:
            return await ask_ephemeral(
                sources,
                text,
                config,
                model=model,
                inject=inject,
                filter=filter,
                allow_commands=True,  # typed by the user on the command line
                on_failure=lambda failure: err.print(
                    Text.assemble(("failed ", "yellow"), f"{failure.uri}: {failure.reason}")
                ),
            )
        async with _client(ctx, read_only=True) as kb:
            if inject:
                return await kb.ask(text, filter=filter, model=model, inject=True)
            return await kb.ask(text, filter=filter, model=model)

    answer, citations = _run(ctx, work)
    out.print(answer, highlight=False, markup=False)
    if citations:
        out.print("\nSources:", highlight=False, markup=False)
    for citation in citations:
        title = citation.document_title or citation.document_uri
        out.print(
            f"[{citation.index}] {title} ({citation.document_uri}, chunk {citation.chunk_id})",
            highlight=False,
            markup=False,
        )


@app.command()
def chat(
    ctx: typer.Context,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Chat model, e.g. openai:gpt-5 (default: qa.model)."),
    ] = None,
) -> None:
    """Chat over the knowledge base (.rag NAME, .file DOC -- question, .exit rag, .exit)."""
    options: Options = ctx.obj

    async def work() -> None:
        from haiku.rag.chat import HISTORY_FILE, enable_history, run_chat

        config = options.config()
        save_history = enable_history(config.storage.data_dir / HISTORY_FILE)
        try:
            await run_chat(
                input,
                lambda text: out.print(text, highlight=False, markup=False),
                config=config,
                model=model,
                db=options.db,
                rag_name=options.rag,
            )
        finally:
            if save_history is not None:
                save_history()

    _run(ctx, work)


@app.command()
def attach(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Name of the attach file (NAME.qdrant.yaml).")],
    host: Annotated[str, typer.Option(help="Qdrant host, HOST[:PORT] (port 6333 by default).")],
    collection: Annotated[str, typer.Option(help="The existing collection to search.")],
    api_key_env: Annotated[
        str | None,
        typer.Option(help="Name of the environment variable holding the API key (never stored)."),
    ] = None,
    https: Annotated[bool, typer.Option(help="Connect over HTTPS.")] = False,
    model: Annotated[
        str | None,
        typer.Option(help="Embedding model that built the collection (default: the config's)."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing attach file.")] = False,
) -> None:
    """Attach an existing Qdrant collection read-only; then search it with --db NAME.qdrant.yaml."""
    from haiku.rag.store.qdrant import attach_command

    options: Options = ctx.obj

    async def work() -> object:
        return await asyncio.to_thread(
            attach_command,
            name,
            host,
            collection,
            api_key_env=api_key_env,
            https=https,
            embedding_model=model,
            config=options.config(),
            force=force,
            echo=lambda line: out.print(line, highlight=False),
            warn=lambda line: err.print(Text(line, style="yellow")),
        )

    _run(ctx, work)


@app.command()
def mcp(
    ctx: typer.Context,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Open the store read-only; no write tools.")
    ] = False,
    http: Annotated[
        bool, typer.Option("--http", help="Serve streamable HTTP instead of stdio.")
    ] = False,
    host: Annotated[str, typer.Option(help="Address to listen on with --http.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port for --http.")] = 8000,
) -> None:
    """Serve the knowledge base over MCP (stdio by default) for other agents and editors."""

    async def work() -> None:
        from haiku.rag.mcp import serve  # raises a ConfigError naming the extra when missing

        kb = _client(ctx, create=not read_only, read_only=read_only)
        await serve(
            kb, read_only=read_only, transport="http" if http else "stdio", host=host, port=port
        )

    _run(ctx, work)


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
