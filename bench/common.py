"""Pieces every benchmark shares: the Markdown table printer and a query-embedder stand-in."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if value < 100 else f"{value:,.0f}"
    return str(value)


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A titled Markdown table, so bench output pastes into docs/benchmarks.md as is."""
    cells = [[str(c) for c in header]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [f"\n{title}", ""]
    lines.append(
        "| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)) + " |"
    )
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return "\n".join(lines)


class FixedQueries:
    """An embedder stand-in returning precomputed query vectors, so a benchmark measures
    the store and the retriever, not the embedding model."""

    def __init__(self, vectors: dict[str, np.ndarray]) -> None:
        self.vectors = vectors

    async def embed_query(self, text: str) -> np.ndarray:
        return self.vectors[text]
