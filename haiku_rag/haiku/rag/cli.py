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
from dataclasses import asdict, dataclass
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

from haiku.rag.client import DB_ENV, HaikuRAG
from haiku.rag.config import AppConfig, load_config
from haiku.rag.documents import SearchResult
from haiku.rag.errors import HaikuRAGError

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
) -> None:
    ctx.obj = Options(db=db, config_path=config, verbose=verbose)


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
    options: Options = ctx.obj
    return HaikuRAG(options.db, options.config(), create=create, read_only=read_only)


class BarProgress:
    """The client's Progress hooks drawn as rich progress bars on stderr."""

    def __init__(self, progress: RichProgress) -> None:
        self._progress = progress
        self._tasks: dict[str, TaskID] = {}

    def start(self, task: str, total: int) -> None:
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
        typer.Argument(help="Files, directories, globs ('docs/**/*.md'), URLs, 'a;b' lists."),
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
                report = await kb.add(*sources, prune=prune, progress=bars)
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
) -> None:
    """Hybrid search (vector + BM25, fused by RRF); no LLM needed."""

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
    table.add_column("source")
    table.add_column("text")
    for result in results:
        source = result.document_title or result.document_uri
        if result.headings:
            source += "\n" + " > ".join(result.headings)
        snippet = " ".join(result.content.split())
        table.add_row(
            str(result.rank),
            f"{result.score:.4f}",
            f"{source}\n[dim]{result.document_uri}[/dim]\nchunk {result.chunk_id}",
            snippet[:400] + ("..." if len(snippet) > 400 else ""),
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
    """Re-chunk and re-embed every document."""

    async def work() -> int:
        async with _client(ctx) as kb:
            with _bars() as bars:
                return await kb.rebuild(progress=bars)

    out.print(f"Rebuilt: {_run(ctx, work)} chunks embedded")


@app.command()
def info(ctx: typer.Context) -> None:
    """Show the knowledge base: path, driver, counts, embedding model, config in use."""

    async def work() -> Any:
        async with _client(ctx, read_only=True) as kb:
            return await kb.info()

    details = asdict(_run(ctx, work))
    extra = details.pop("extra")
    details["signals"] = ", ".join(details["signals"])
    details["config_file"] = details["config_file"] or "(defaults)"
    if "chunk_size_reason" in extra:
        details["chunk_size"] = f"{details['chunk_size']} ({extra.pop('chunk_size_reason')})"
    details.update(extra)
    width = max(len(key) for key in details)
    for key, value in details.items():
        out.print(f"{key:<{width}}  {value}", highlight=False)


@app.command()
def ask(
    ctx: typer.Context,
    question: Annotated[str, typer.Argument(help="The question to answer from the documents.")],
    filter: Annotated[
        str | None, typer.Option("--filter", help="Only documents whose uri matches this glob.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Chat model, e.g. openai:gpt-5 (default: qa.model)."),
    ] = None,
) -> None:
    """Answer a question from the knowledge base, with numbered sources (needs a chat model)."""

    async def work() -> tuple[str, list[Any]]:
        async with _client(ctx, read_only=True) as kb:
            return await kb.ask(question, filter=filter, model=model)

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


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
