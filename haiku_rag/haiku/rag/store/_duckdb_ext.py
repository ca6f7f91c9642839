"""DuckDB connections with the `vss` and `fts` extensions loaded offline.

The extension binaries ship inside pinned Python packages (`duckdb-extension-vss`,
`duckdb-extension-fts`, same version as `duckdb`). They are loaded by file path, and
every connection is opened with DuckDB's auto-install and auto-load turned off, so
nothing is ever fetched from the network (`INSTALL` is never issued) and nothing is
read from or written to `~/.duckdb/extensions`.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import duckdb

from haiku.rag.errors import StoreError

EXTENSIONS: dict[str, str] = {"vss": "duckdb_extension_vss", "fts": "duckdb_extension_fts"}
"""Extension name -> the Python package that ships its binary."""

OFFLINE_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
"""Passed to every `duckdb.connect`: a missing extension is an error, never a download."""


@functools.cache
def extension_path(name: str) -> Path:
    """The `.duckdb_extension` file for this DuckDB version inside its pinned package."""
    package = EXTENSIONS[name]
    version = duckdb.__version__
    fix = f"install it with `pip install {package.replace('_', '-')}=={version}`"
    spec = importlib.util.find_spec(package)
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    if not roots:
        raise StoreError(f"The DuckDB {name} extension package {package} is missing; {fix}")
    for root in roots:
        candidate = Path(root) / "extensions" / f"v{version}" / f"{name}.duckdb_extension"
        if candidate.is_file():
            return candidate
    shipped = sorted(p.parent.name for p in Path(roots[0]).glob(f"extensions/*/{name}*"))
    raise StoreError(
        f"{package} has no {name} extension for duckdb {version} "
        f"(it ships {', '.join(shipped) or 'none'}); {fix}"
    )


def load_extensions(connection: duckdb.DuckDBPyConnection) -> None:
    """LOAD every extension from its file (a path, so DuckDB never looks it up online)."""
    for name in EXTENSIONS:
        quoted = str(extension_path(name)).replace("'", "''")
        connection.execute(f"LOAD '{quoted}'")


def connect(path: Path, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    """Open `path` with auto-install off and both extensions loaded from their packages."""
    connection = duckdb.connect(str(path), read_only=read_only, config=OFFLINE_CONFIG)
    try:
        load_extensions(connection)
    except BaseException:
        connection.close()
        raise
    return connection
