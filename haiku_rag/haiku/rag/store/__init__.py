"""Driver selection: pick a storage driver by name or by the shape of the path."""

from __future__ import annotations

import importlib
from pathlib import Path

from haiku.rag.errors import StoreError
from haiku.rag.store.base import Ranked, Store, StoreFeatures, StoreSettings

__all__ = [
    "DRIVERS",
    "Ranked",
    "Store",
    "StoreFeatures",
    "StoreSettings",
    "driver_class",
    "infer_driver",
]

DRIVERS: dict[str, str] = {
    "lancedb": "haiku.rag.store.lancedb:LanceDBStore",
    "qdrant": "haiku.rag.store.qdrant:QdrantStore",
    "yaml": "haiku.rag.store.yaml:YamlStore",
    "duckdb": "haiku.rag.store.duckdb:DuckDBStore",
}
"""Driver name -> `module:Class`; imported lazily so unused drivers cost nothing."""

_SUFFIXES = {".lancedb": "lancedb", ".yaml": "yaml", ".yml": "yaml", ".duckdb": "duckdb"}
_QDRANT_ATTACH_SUFFIXES = (".qdrant.yaml", ".qdrant.yml")
_QDRANT_SCHEMES = ("qdrant:", "http:", "https:")
"""A Qdrant attach file, or a collection URL (pathlib may have collapsed its `//`)."""


def infer_driver(path: str | Path, driver: str | None = None) -> str:
    """The explicit `driver`, else the one the path names (its suffix, a Qdrant attach file
    or collection URL), else lancedb."""
    if driver is not None:
        if driver not in DRIVERS:
            known = ", ".join(sorted(DRIVERS))
            raise StoreError(f"Unknown storage driver {driver!r}; known drivers: {known}")
        return driver
    text = str(path).lower()
    if text.startswith(_QDRANT_SCHEMES) or text.endswith(_QDRANT_ATTACH_SUFFIXES):
        return "qdrant"
    return _SUFFIXES.get(Path(str(path)).suffix.lower(), "lancedb")


def driver_class(name: str) -> type[Store]:
    module_name, _, class_name = DRIVERS[infer_driver("", name)].partition(":")
    cls: type[Store] = getattr(importlib.import_module(module_name), class_name)
    return cls
