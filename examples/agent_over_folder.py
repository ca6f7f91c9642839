"""An agent that answers from a folder of documents, with numbered citations.

    python examples/agent_over_folder.py docs/ "How are results fused?" --model openai:gpt-5

The folder is added to a knowledge base first (only new or changed files are
embedded, so running it again is cheap); then a Pydantic AI agent gets the RAG
capability over that knowledge base: `search`, `execute_code` (Python over the
documents, in a sandbox) and `cite`. The citations come from the capability's state,
not from the answer's text, so they are exactly the chunks the model registered.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models import Model

from haiku.rag import AppConfig, Citation, HaikuRAG
from haiku.rag.capabilities.rag import create_capability
from haiku.rag.capabilities.state import RAGDeps


async def answer(
    folder: str | Path,
    question: str,
    *,
    db: str | Path = "folder.lancedb",
    model: Model | str = "openai:gpt-5",
    config: AppConfig | None = None,
) -> tuple[str, list[Citation]]:
    """Index `folder` into `db`, then answer `question` from it."""
    async with HaikuRAG(db, config, create=True) as kb:
        report = await kb.add(str(folder))
        print(f"{folder}: {report.summary()}")
        agent = Agent(model, deps_type=RAGDeps, capabilities=[create_capability(rag=kb)])
        deps = RAGDeps()  # the capability keeps its state in deps.state["rag"]
        result = await agent.run(question, deps=deps)
        return result.output, deps.state["rag"].cited()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="Folder of Markdown, text or HTML files.")
    parser.add_argument("question")
    parser.add_argument("--db", default="folder.lancedb", help="Knowledge base path.")
    parser.add_argument("--model", default="openai:gpt-5", help="Pydantic AI chat model.")
    args = parser.parse_args(argv)
    text, citations = asyncio.run(answer(args.folder, args.question, db=args.db, model=args.model))
    print(text)
    for citation in citations:
        print(f"[{citation.index}] {citation.document_uri} (chunk {citation.chunk_id})")


if __name__ == "__main__":
    main()
