"""Embedding speed: texts/s of hash:v1 and all-MiniLM-L6-v2 (ONNX int8 and sentence-transformers).

All three embed the same texts through EmbeddingService (batches of 32, as ingest
does). Load time (import + weights + first call) is reported apart from throughput.
The two MiniLM backends are also compared: mean and minimum cosine per text.

    python bench/embedders.py [--texts 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from haiku.rag.embeddings import (
    EmbeddingService,
    HashEmbeddingModel,
    MiniLMEmbeddingModel,
    _bucket,
)

LICENSES = Path("/usr/share/common-licenses")


def paragraphs(count: int) -> tuple[list[str], str]:
    """Real prose where the machine has it (license texts), generated text otherwise."""
    found: list[str] = []
    if LICENSES.is_dir():
        for path in sorted(LICENSES.iterdir()):
            if path.is_file():
                text = path.read_text(encoding="utf-8", errors="replace")
                for block in re.split(r"\n\s*\n", text):
                    paragraph = re.sub(r"\s+", " ", block).strip()
                    if len(paragraph) >= 200:
                        found.append(paragraph)
    if len(found) >= count:
        return found[:count], str(LICENSES)
    rng = random.Random(0)
    words = ["the", "of", "a", "vector", "index", "query", "store", "chunk", "document"]
    generated = [" ".join(rng.choice(words) for _ in range(90)) for _ in range(count)]
    return (found + generated)[:count], "generated"


@dataclass
class Row:
    name: str
    load_s: float
    run_s: float
    count: int
    vectors: np.ndarray

    @property
    def per_second(self) -> float:
        return self.count / self.run_s


async def measure(name: str, service: EmbeddingService, texts: list[str], warm: bool) -> Row:
    started = time.perf_counter()
    if warm:  # import, weights, first inference: paid once per process
        await service.embed_documents(texts[:1])
    loaded = time.perf_counter()
    vectors = await service.embed_documents(texts)
    done = time.perf_counter()
    return Row(name, loaded - started, done - loaded, len(texts), vectors)


async def main(count: int) -> None:
    texts, source = paragraphs(count)
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    mean_chars = sum(map(len, texts)) / len(texts)
    print(f"{len(texts)} texts from {source}, {mean_chars:.0f} chars on average; {threads} CPUs")

    _bucket.cache_clear()  # no head start from earlier runs in this process
    hash_service = EmbeddingService("hash:v1", HashEmbeddingModel())
    onnx_service = EmbeddingService("local:all-MiniLM-L6-v2", MiniLMEmbeddingModel("onnx"))
    st_service = EmbeddingService(
        "local:all-MiniLM-L6-v2", MiniLMEmbeddingModel("sentence-transformers")
    )
    rows = [
        await measure("hash:v1", hash_service, texts, warm=False),
        await measure("MiniLM onnx int8", onnx_service, texts, warm=True),
        await measure("MiniLM sentence-transformers", st_service, texts, warm=True),
    ]
    agreement = (rows[1].vectors * rows[2].vectors).sum(axis=1)

    print()
    print(f"| {'embedder':<30} | {'load s':>7} | {'texts/s':>8} | {'ms/text':>8} |")
    print(f"|{'-' * 32}|{'-' * 9}|{'-' * 10}|{'-' * 10}|")
    for row in rows:
        print(
            f"| {row.name:<30} | {row.load_s:>7.2f} | {row.per_second:>8.1f} "
            f"| {1000 * row.run_s / row.count:>8.2f} |"
        )
    print()
    print(
        f"onnx vs sentence-transformers cosine: mean {agreement.mean():.4f}, "
        f"min {agreement.min():.4f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=200, help="how many texts to embed")
    asyncio.run(main(parser.parse_args().texts))
