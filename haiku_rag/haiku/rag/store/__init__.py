"""Driver selection: pick a storage driver by name or by the shape of the path."""

from __future__ import annotations

import importlib
import re
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
    or collection URL), else lancedb for a path without a suffix; an unknown suffix is an
    error rather than a surprise directory named `notes.txt`."""
    if driver is not None:
        if driver not in DRIVERS:
            known = ", ".join(sorted(DRIVERS))
            raise StoreError(f"Unknown storage driver {driver!r}; known drivers: {known}")
        return driver
    text = str(path).lower()
    if text.startswith(_QDRANT_SCHEMES) or text.endswith(_QDRANT_ATTACH_SUFFIXES):
        return "qdrant"
    suffix = Path(str(path)).suffix.lower()
    if not suffix:
        return "lancedb"
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    owner = sniff_driver(path)  # an existing store under an unusual name
    if owner is not None:
        return owner
    raise StoreError(
        f"Cannot tell the storage driver from the path {path}: name it .lancedb, .yaml or "
        ".duckdb, or choose the driver (--driver on the command line, driver= in Python)"
    )


_DRIVER_MARK = re.compile(rb'"driver":\s*"(?P<name>[a-z]+)"')


def sniff_driver(path: str | Path) -> str | None:
    """Which driver owns what is at `path`, judged from its files; None when unknown.

    Lets a driver that finds another one's store say so, and how to switch."""
    root = Path(str(path)).expanduser()
    if root.is_dir():
        return "lancedb" if (root / "settings.lance").exists() else None
    candidates = [root]
    if root.suffix.lower() == ".duckdb":
        candidates.insert(0, root.with_suffix(".yaml"))
    for candidate in candidates:
        try:
            with candidate.open("rb") as file:
                head = file.read(4096)
        except OSError:
            continue
        if match := _DRIVER_MARK.search(head):
            return match["name"].decode()
    return "duckdb" if root.suffix.lower() == ".duckdb" and root.is_file() else None


def wrong_driver_message(path: str | Path, owner: str, wanted: str) -> str:
    return (
        f"{path} is a {owner} store, not a {wanted} one: open it with driver={owner!r} "
        f"(or by its path). To switch drivers, create a new store with driver={wanted!r} "
        "and add the documents again"
    )


def driver_class(name: str) -> type[Store]:
    module_name, _, class_name = DRIVERS[infer_driver("", name)].partition(":")
    cls: type[Store] = getattr(importlib.import_module(module_name), class_name)
    return cls
