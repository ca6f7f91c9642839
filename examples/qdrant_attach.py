"""Search an existing Qdrant collection in place: attach it read-only, then query it.

    python examples/qdrant_attach.py localhost:6333 docs "vector database" \\
        --model openai:text-embedding-3-small --api-key-env QDRANT_API_KEY

Nothing is copied or written to Qdrant. `attach` checks the collection (a single
unnamed vector, `page_content` payloads, as LangChain writes them) and saves an
attach file, `NAME.qdrant.yaml`, that any haiku.rag entry point opens like a store:
`HaikuRAG("docs.qdrant.yaml")`, `haiku-rag --db docs.qdrant.yaml search ...`, the
capability's `db_path=` or `haiku-rag --db docs.qdrant.yaml mcp`.

`--model` must be the embedding model that built the collection: Qdrant stores only
vectors, so a different model of the same size would rank by noise without any
error. The API key is read from the named environment variable on every request and
never written to the attach file.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from haiku.rag import AppConfig, HaikuRAG, SearchResult
from haiku.rag.store.qdrant import attach


async def search_collection(
    host: str,
    collection: str,
    query: str,
    *,
    model: str,
    attach_file: str | Path = "docs.qdrant.yaml",
    api_key_env: str | None = None,
    config: AppConfig | None = None,
    top_k: int = 5,
) -> list[SearchResult]:
    """Attach `collection` on `host` (HOST[:PORT]) as `attach_file` and search it."""
    report = await asyncio.to_thread(
        attach,
        attach_file,
        host,
        collection,
        embedding_model=model,
        api_key_env=api_key_env,
        overwrite=True,
    )
    for line in report.lines():
        print(line)
    async with HaikuRAG(attach_file, config, read_only=True) as kb:
        return await kb.search(query, top_k=top_k)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host", help="Qdrant HOST[:PORT] (port 6333 by default).")
    parser.add_argument("collection")
    parser.add_argument("query")
    parser.add_argument("--model", required=True, help="The collection's embedding model.")
    parser.add_argument("--api-key-env", help="Environment variable holding the API key.")
    parser.add_argument("--attach-file", default="docs.qdrant.yaml")
    args = parser.parse_args(argv)
    results = asyncio.run(
        search_collection(
            args.host,
            args.collection,
            args.query,
            model=args.model,
            attach_file=args.attach_file,
            api_key_env=args.api_key_env,
        )
    )
    for result in results:
        print(f"{result.rank}. {result.document_uri} ({result.score:.3f}): {result.content[:80]}")


if __name__ == "__main__":
    main()
