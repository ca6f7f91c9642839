"""The reranker seam: re-score fused candidates with a model that reads query and text.

Providers (cross-encoders, hosted rerank APIs) come later; the retriever only
depends on this protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from haiku.rag.documents import SearchResult


@runtime_checkable
class Reranker(Protocol):
    """Orders candidates by relevance to the query; replaces RRF when configured."""

    async def rerank(
        self, query: str, candidates: Sequence[SearchResult]
    ) -> list[tuple[str, float]]:
        """`(chunk_id, score)` for the candidates, best first (higher score is better).

        May return fewer ids than it was given (a cut-off); ids that are not among
        the candidates are ignored. Raising makes the retriever fall back to the RRF
        order with a warning, so a flaky provider degrades search instead of breaking it.
        """
        ...
