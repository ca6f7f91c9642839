"""Ephemeral RAG: a knowledge base built for one question and thrown away.

    answer, citations = await ask_ephemeral(["notes.md", "`git diff`"], "What changed?")

`haiku-rag ask --file DOC [--file DOC ...] -- question` and `.file` in `haiku-rag
chat` use it. Sources are any `load_sources` spec (files, globs, URLs, loaders,
`` `cmd` `` output); `documents=` adds ready-made documents (chat's `%%`, the last
reply). The store is a YAML store in a temporary directory, deleted on exit: for a
handful of documents it is the fastest driver, ~31 ms to create, add five small
documents and search, against ~72 ms for LanceDB (hash embedder, 2 shared cores;
LanceDB pays for its table and full-text index setup). Embedding uses the
configured model, so the local default needs no network.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig, load_config
from haiku.rag.documents import Citation, Document
from haiku.rag.errors import HaikuRAGError, SourceError
from haiku.rag.sources import CommandPolicy, SourceFailure, load_sources

DRIVER = "yaml"
STORE_NAME = "ephemeral.yaml"
"""The store file in the temporary directory; its stem, `ephemeral`, is the `rag_name`."""


@asynccontextmanager
async def ephemeral_kb(
    sources: Sequence[str] = (),
    config: AppConfig | None = None,
    *,
    documents: Sequence[Document] = (),
    on_failure: Callable[[SourceFailure], None] | None = None,
    allow_commands: bool = False,
) -> AsyncIterator[HaikuRAG]:
    """An open, writable knowledge base holding `sources` and `documents`, deleted on exit.

    Items of a directory or glob that cannot be read go to `on_failure` and the rest is
    used; nothing loaded at all is a `SourceError`. `` `cmd` `` sources run a shell
    command, so they need `allow_commands` (only for specs a person typed).
    """
    if not sources and not documents:
        raise SourceError("No document given for the question: pass at least one source")
    config = config if config is not None else load_config()
    with tempfile.TemporaryDirectory(prefix="haiku-rag-") as directory:
        kb = HaikuRAG(Path(directory) / STORE_NAME, config, create=True, driver=DRIVER)
        async with kb:
            if sources:
                report = await kb.add(*sources, prune=False, allow_commands=allow_commands)
                for failure in report.failed:
                    if on_failure is not None:
                        on_failure(failure)
            for document in documents:
                await kb.add_text(
                    document.content,
                    uri=document.uri,
                    title=document.title,
                    metadata=document.metadata,
                )
            if await asyncio.to_thread(kb.store.count_documents) == 0:
                named = ", ".join([*sources, *(d.uri for d in documents)])
                raise SourceError(
                    f"No document could be loaded from {named}: check the paths (or the "
                    "command) and that the files are text"
                )
            yield kb


async def ask_ephemeral(
    sources: Sequence[str],
    question: str,
    config: AppConfig | None = None,
    *,
    model: Any = None,
    inject: bool = False,
    filter: str | None = None,
    documents: Sequence[Document] = (),
    on_failure: Callable[[SourceFailure], None] | None = None,
    allow_commands: bool = False,
) -> tuple[str, list[Citation]]:
    """Answer `question` from `sources` (and `documents`) only, then discard the store.

    `inject` sends the filled RAG template with the question (the context capability)
    instead of letting the model search and cite (the RAG capability); `model`
    overrides `qa.model`; `filter` narrows the documents as in `HaikuRAG.search`;
    `allow_commands` lets `` `cmd` `` sources run (see `ephemeral_kb`). Returns the
    answer and its citations.
    """
    async with ephemeral_kb(
        sources,
        config,
        documents=documents,
        on_failure=on_failure,
        allow_commands=allow_commands,
    ) as kb:
        return await kb.ask(question, filter=filter, model=model, inject=inject)


async def question_and_sources(
    words: Sequence[str],
    files: Sequence[str],
    config: AppConfig | None = None,
    *,
    allow_commands: bool = False,
) -> tuple[str, list[str]]:
    """`ask`'s arguments -> (question, sources of an ephemeral knowledge base).

    The words (after `--`) are the question and every `--file` a source. With no
    question, a single `--file` is the question itself (its contents), answered from
    the knowledge base: no sources are returned then.
    """
    question = " ".join(words).strip()
    if question:
        return question, list(files)
    if len(files) == 1:
        return await read_prompt(files[0], config, allow_commands=allow_commands), []
    if files:
        raise HaikuRAGError(
            "No question for the --file sources: put it after `--`, e.g. "
            "haiku-rag ask --file a.md --file b.md -- 'What changed?'"
        )
    raise HaikuRAGError(
        "No question: haiku-rag ask 'question' (or --file QUESTION.txt to read it from a file)"
    )


async def read_prompt(
    spec: str, config: AppConfig | None = None, *, allow_commands: bool = False
) -> str:
    """The text of one source (a file, a URL, `` `cmd` ``...), used as a prompt."""
    config = config if config is not None else load_config()
    commands = CommandPolicy.from_config(config, allow_commands=allow_commands)
    batch = await load_sources([spec], commands=commands)
    text = "\n\n".join(document.content for document in batch.documents).strip()
    if not text:
        raise SourceError(f"{spec} is empty: there is no question to ask")
    return text
