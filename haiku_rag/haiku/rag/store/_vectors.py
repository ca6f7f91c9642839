"""Cosine kNN over an in-memory matrix: exact with numpy, HNSW (hnswlib) once it pays off.

For drivers that load vectors into memory and have no vector index of their own.
Vectors are L2-normalised float32 rows (the store protocol's invariant), so cosine
similarity is a dot product and scores are the same whichever path answers.

When HNSW pays off, measured on the project's 2-core machine with 384-d clustered
unit vectors, top 10 (`python bench/drivers.py --vectors` prints this table):

| rows | exact / query | HNSW / query | HNSW build | recall@10 | queries to repay build |
|---:|---:|---:|---:|---:|---:|
| 2k | 0.12 ms | 0.07 ms | 0.06 s | 1.00 | ~1,000 |
| 10k | 0.6 ms | 0.13 ms | 0.6 s | 1.00 | ~1,300 |
| 20k | 1.2 ms | 0.14 ms | 1.6 s | 1.00 | ~1,450 |
| 100k | 9.6 ms | 0.23 ms | 19 s | 1.00 | ~2,000 |

(On the same machine under load from other jobs, the 100k build took ~55 s.)
Per query, HNSW wins from ~2k rows; counting its build, it wins only after
1,000-2,000 queries at every size, because building costs about that many exact
searches. So the graph is built only when both hold: the matrix has at least
`HNSW_MIN_ROWS` rows (below that an exact query costs ~1 ms, nothing to win) and
this index has already answered `HNSW_AFTER_QUERIES` queries exactly, i.e. has
spent about the build cost on exact search (the ski-rental rule: never pay more
than twice the best choice made in hindsight). A CLI call that opens a store and
runs one query never waits for a build; a long-running agent gets HNSW after its
first couple of thousand searches. `build_hnsw()` forces it.

Why hnswlib: the reference HNSW implementation (the paper authors'), one C++
header with numpy bindings, inner-product space, multi-threaded build and filtered
queries; numpy has no ANN index, and faiss-cpu or usearch would add a much larger
API for the one structure used here. It is imported only when a graph is built:
without it (it compiles from source on install) the index simply stays exact.
HNSW candidates are re-scored exactly, so returned scores are true cosine
similarities and the order matches exact search whenever the right chunks are
among the candidates.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from haiku.rag.store.base import Ranked

logger = logging.getLogger(__name__)

HNSW_MIN_ROWS = 20_000
"""Rows from which an HNSW graph may be built (see the table above)."""
HNSW_AFTER_QUERIES = 2_000
"""Exact queries answered before the graph is built: about its measured build cost."""
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 100
HNSW_EF_SEARCH = 100
BLOCK_ROWS = 1024
"""Rows per matrix-vector product. OpenBLAS threads larger `sgemv` calls, and on two
busy cores the hand-off cost 1-10 ms per query; 1024-row blocks stay single-threaded
and run at memory speed."""


class VectorIndex:
    """Read-only kNN over `vectors` (row i is `ids[i]`, belonging to `groups[i]`)."""

    def __init__(
        self,
        ids: Sequence[str],
        groups: Sequence[str],
        vectors: np.ndarray,
        *,
        hnsw_min_rows: int = HNSW_MIN_ROWS,
        hnsw_after_queries: int = HNSW_AFTER_QUERIES,
    ) -> None:
        matrix = np.ascontiguousarray(vectors, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[0] != len(ids) or len(ids) != len(groups):
            raise ValueError("VectorIndex needs one id, one group and one vector row per chunk")
        self._ids = list(ids)
        self._groups = list(groups)
        self._matrix = matrix
        self.hnsw_min_rows = hnsw_min_rows
        self.hnsw_after_queries = hnsw_after_queries
        self.exact_queries = 0
        self._hnsw: Any = None
        self._rows_by_group: dict[str, np.ndarray] | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def dim(self) -> int:
        return int(self._matrix.shape[1])

    @property
    def uses_hnsw(self) -> bool:
        return self._hnsw is not None

    def build_hnsw(self) -> None:
        """Build the HNSW graph now (all cores); later searches use it."""
        with self._lock:
            if self._hnsw is not None or not self._ids:
                return
            try:
                import hnswlib
            except ImportError:
                logger.warning("hnswlib is not installed: vector search stays exact")
                self.hnsw_min_rows = 1 << 62
                return
            index = hnswlib.Index(space="ip", dim=self.dim)
            index.init_index(
                max_elements=len(self._ids), ef_construction=HNSW_EF_CONSTRUCTION, M=HNSW_M
            )
            index.add_items(self._matrix, np.arange(len(self._ids)), num_threads=-1)
            index.set_ef(HNSW_EF_SEARCH)
            self._hnsw = index

    def search(
        self, query: np.ndarray, limit: int, groups: Collection[str] | None = None
    ) -> Ranked:
        """`(id, cosine)` best first, ties by id, restricted to rows of `groups` if given."""
        vector = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        if vector.shape[0] != self.dim:
            raise ValueError(f"query has {vector.shape[0]} dimensions, the index {self.dim}")
        if limit <= 0 or not self._ids or (groups is not None and not groups):
            return []
        rows = None if groups is None else self._rows_for(groups)
        if rows is not None and rows.size == 0:
            return []
        if (
            self._hnsw is None
            and len(self._ids) >= self.hnsw_min_rows
            and self.exact_queries >= self.hnsw_after_queries
        ):
            self.build_hnsw()
        selected = len(self._ids) if rows is None else int(rows.size)
        if self._hnsw is not None and selected >= self.hnsw_min_rows:
            found = self._search_hnsw(vector, limit, rows)
            if found is not None:
                return found
        self.exact_queries += 1
        return self._search_exact(vector, limit, rows)

    # -- internals -----------------------------------------------------------

    def _rows_for(self, groups: Collection[str]) -> np.ndarray:
        if self._rows_by_group is None:
            by_group: dict[str, list[int]] = {}
            for row, group in enumerate(self._groups):
                by_group.setdefault(group, []).append(row)
            self._rows_by_group = {
                group: np.asarray(rows, dtype=np.int64) for group, rows in by_group.items()
            }
        parts = [self._rows_by_group[g] for g in set(groups) if g in self._rows_by_group]
        if not parts:
            return np.empty(0, dtype=np.int64)
        return np.sort(np.concatenate(parts))

    def _scores(self, matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
        scores = np.empty(matrix.shape[0], dtype=np.float32)
        for start in range(0, matrix.shape[0], BLOCK_ROWS):
            stop = start + BLOCK_ROWS
            np.dot(matrix[start:stop], vector, out=scores[start:stop])
        return scores

    def _search_exact(self, vector: np.ndarray, limit: int, rows: np.ndarray | None) -> Ranked:
        matrix = self._matrix if rows is None else self._matrix[rows]
        scores = self._scores(matrix, vector)
        if limit < scores.size:
            # Keep every row tied with the k-th best, so the id tie-break is exact.
            kth = np.partition(scores, scores.size - limit)[scores.size - limit]
            picked = np.flatnonzero(scores >= kth)
        else:
            picked = np.arange(scores.size)
        row_ids = picked if rows is None else rows[picked]
        return self._ranked(row_ids, scores[picked], limit)

    def _search_hnsw(
        self, vector: np.ndarray, limit: int, rows: np.ndarray | None
    ) -> Ranked | None:
        """Candidates from the graph, re-scored exactly; None when the graph found too few."""
        assert self._hnsw is not None
        available = len(self._ids) if rows is None else int(rows.size)
        want = min(available, max(2 * limit, limit + 10))
        self._hnsw.set_ef(max(HNSW_EF_SEARCH, want))
        if rows is None:
            labels, _ = self._hnsw.knn_query(vector, k=want, num_threads=1)
        else:
            allowed = np.zeros(len(self._ids), dtype=bool)
            allowed[rows] = True
            try:
                labels, _ = self._hnsw.knn_query(
                    vector, k=want, num_threads=1, filter=lambda label: bool(allowed[label])
                )
            except RuntimeError:  # hnswlib: fewer reachable matches than k
                return None
        candidates = np.asarray(labels[0], dtype=np.int64)
        if candidates.size < min(limit, available):  # pragma: no cover - hnswlib raises first
            return None
        scores = self._scores(self._matrix[candidates], vector)
        return self._ranked(candidates, scores, limit)

    def _ranked(self, rows: np.ndarray, scores: np.ndarray, limit: int) -> Ranked:
        pairs = [
            (self._ids[row], float(score))
            for row, score in zip(rows.tolist(), scores.tolist(), strict=True)
        ]
        pairs.sort(key=lambda pair: (-pair[1], pair[0]))
        return pairs[:limit]


__all__ = [
    "BLOCK_ROWS",
    "HNSW_AFTER_QUERIES",
    "HNSW_MIN_ROWS",
    "VectorIndex",
]
