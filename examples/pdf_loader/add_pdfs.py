"""Add PDFs through a configured document loader (`pdftotext`), then search them.

    python examples/pdf_loader/add_pdfs.py ~/papers/ "attention heads"

or, with the CLI, from this folder (it holds the `haiku.rag.yaml` that configures
the loader):

    haiku-rag --db pdfs.lancedb add ~/papers/ report.pdf pdf:scanned/notes.bin
    haiku-rag --db pdfs.lancedb search "attention heads"

The loader is just a command: any program that prints text (or writes it to `$2`)
works the same way, e.g. `docx: "pandoc -t plain $1"`. A PDF the loader cannot read
is reported as failed with the command's error, and the rest of the batch goes on.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from haiku.rag import AddReport, AppConfig, HaikuRAG, SearchResult, load_config

CONFIG_FILE = Path(__file__).with_name("haiku.rag.yaml")


async def add_and_search(
    source: str | Path,
    query: str,
    *,
    db: str | Path = "pdfs.lancedb",
    config: AppConfig | None = None,
) -> tuple[AddReport, list[SearchResult]]:
    """Add `source` (PDFs and text) with the `pdf` loader configured, then search it."""
    config = config if config is not None else load_config(CONFIG_FILE)
    async with HaikuRAG(db, config, create=True) as kb:
        report = await kb.add(str(source))
        return report, await kb.search(query)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="A PDF, a folder or a glob ('papers/**/*.pdf').")
    parser.add_argument("query")
    parser.add_argument("--db", default="pdfs.lancedb", help="Knowledge base path.")
    args = parser.parse_args(argv)
    report, results = asyncio.run(add_and_search(args.source, args.query, db=args.db))
    print(report.summary())
    for failure in report.failed:
        print(f"failed {failure.uri}: {failure.reason}")
    for result in results:
        print(f"{result.rank}. {result.document_uri}: {' '.join(result.content.split())[:100]}")


if __name__ == "__main__":
    main()
