"""Weighted Reciprocal Rank Fusion: merge ranked lists by rank, never by raw score.

Signals score on incomparable scales (cosine similarity, BM25, graph hops), so
only their ranks are combined: each list adds `weight / (k + rank)` to a chunk.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FusedHit:
    """A chunk after fusion: its fused score and its 1-based rank in each signal."""

    chunk_id: str
    score: float
    ranks: dict[str, int]


def weighted_rrf(
    rankings: Mapping[str, Sequence[str]],
    weights: Mapping[str, float],
    k: int = 60,
) -> list[FusedHit]:
    """Fuse `rankings` (signal -> chunk ids, best first) into one list, best first.

    score = sum over signals of weight / (k + rank), rank 1-based; a chunk listed
    twice by one signal counts once, at its best rank. Ties go to the chunk with
    the best single rank, then to the smaller chunk id, so output is deterministic.
    """
    if k <= 0:
        raise ValueError(f"RRF constant k must be positive, got {k}")
    missing = sorted(set(rankings) - set(weights))
    if missing:
        raise ValueError(f"No RRF weight for signal(s) {', '.join(missing)}")
    ranks: dict[str, dict[str, int]] = {}
    for signal, chunk_ids in rankings.items():
        for position, chunk_id in enumerate(chunk_ids, start=1):
            ranks.setdefault(chunk_id, {}).setdefault(signal, position)
    hits = [
        FusedHit(
            chunk_id=chunk_id,
            # fsum is exactly rounded, so equal contributions give equal scores in
            # any order and ties are real ties.
            score=math.fsum(weights[signal] / (k + rank) for signal, rank in per_signal.items()),
            ranks=per_signal,
        )
        for chunk_id, per_signal in ranks.items()
    ]
    hits.sort(key=lambda hit: (-hit.score, min(hit.ranks.values()), hit.chunk_id))
    return hits
