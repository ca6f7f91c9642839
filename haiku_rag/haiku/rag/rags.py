"""Named knowledge bases: `--rag NAME` and `HaikuRAG.open(NAME)`, kept in one directory.

Users think in names ("my notes"), not in paths and drivers, so every store in the
rags dir is reachable by its name whatever its driver:

| on disk (in the rags dir)           | driver  | opened as          |
|-------------------------------------|---------|--------------------|
| `NAME.lancedb/`                     | lancedb | `NAME.lancedb`     |
| `NAME.yaml` (or `.yml`)             | yaml    | `NAME.yaml`        |
| `NAME.duckdb` + its `NAME.yaml`     | duckdb  | `NAME.duckdb`      |
| `NAME.qdrant.yaml` (attach file)    | qdrant  | `NAME.qdrant.yaml` |

A `NAME.yaml` whose header says `"driver": "duckdb"` is a duckdb store's sidecar,
even when its database is missing (the driver then says so on open). Two stores
with one name are an error naming both files, never a guess. Hidden entries and
files of other kinds (a DuckDB `.wal`, temporary files) are not stores.

The rags dir is `HAIKU_RAG_RAGS_DIR`, else `storage.rags_dir`, else `<data_dir>/rags`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from haiku.rag.config import AppConfig, load_config
from haiku.rag.errors import HaikuRAGError, StoreError, StoreNotFoundError

RAGS_DIR_ENV = "HAIKU_RAG_RAGS_DIR"
DRIVER_CHOICES = ("yaml", "duckdb", "lancedb")
"""Drivers a new named knowledge base can be created with (Qdrant is attached, not created)."""
DEFAULT_DRIVER = "lancedb"
CREATE_SUFFIXES = {"lancedb": ".lancedb", "yaml": ".yaml", "duckdb": ".duckdb"}
_QDRANT_SUFFIXES = (".qdrant.yaml", ".qdrant.yml")
_YAML_SUFFIXES = (".yaml", ".yml")
_NAME_SUFFIXES = (".lancedb", ".duckdb", ".qdrant", *_YAML_SUFFIXES)
_HEADER_BYTES = 4096


def rags_dir(config: AppConfig | None = None) -> Path:
    """`HAIKU_RAG_RAGS_DIR`, else `storage.rags_dir`, else `<data_dir>/rags` (may not exist)."""
    env = os.environ.get(RAGS_DIR_ENV)
    if env:
        return Path(env).expanduser()
    storage = (config if config is not None else load_config()).storage
    return (storage.rags_dir or storage.data_dir / "rags").expanduser()


def check_name(name: str) -> str:
    """`name` if it can name a knowledge base; StoreError saying why not otherwise.

    A name is a file stem in one directory: no separators, not hidden, no store suffix.
    """
    problem = None
    if not name or name != name.strip():
        problem = "it is empty or starts or ends with a space"
    elif any(sep in name for sep in ("/", "\\", "\x00", os.sep, os.altsep or "/")):
        problem = "it contains a path separator (to use a store elsewhere, pass --db PATH)"
    elif name.startswith("."):
        problem = "it starts with a dot"
    elif name.lower().endswith(_NAME_SUFFIXES):
        stem = name[: name.rindex(".")]
        problem = f"it ends with a store suffix; the name is {stem!r}"
    if problem is not None:
        raise StoreError(f"Invalid knowledge base name {name!r}: {problem}")
    return name


@dataclass(frozen=True)
class RagEntry:
    """A named knowledge base: how to open it, and the files that make it up."""

    name: str
    driver: str
    location: Path
    """What `HaikuRAG(location, driver=driver)` opens."""
    files: tuple[Path, ...] = ()
    """Everything on disk that belongs to it (empty for one not created yet)."""

    @property
    def exists(self) -> bool:
        return bool(self.files)

    @property
    def size(self) -> int:
        """Bytes on disk, directories included recursively."""
        return sum(_size(path) for path in self.files)


def _size(path: Path) -> int:
    if not path.is_dir():
        return path.stat().st_size if path.exists() else 0
    return sum(
        (Path(root) / name).stat().st_size
        for root, _, names in os.walk(path)
        for name in names
        if (Path(root) / name).is_file()
    )


def _yaml_driver(path: Path) -> str:
    """The driver a `.yaml` store file records in its `haiku_rag:` header line (yaml if none)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_HEADER_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return "yaml"
    for line in head.splitlines():
        if line.startswith("haiku_rag:"):
            value = line.partition(":")[2].strip()
            try:
                header = json.loads(value)
            except ValueError:
                try:
                    header = yaml.safe_load(value)
                except yaml.YAMLError:
                    return "yaml"
            driver = header.get("driver") if isinstance(header, dict) else None
            return driver if driver == "duckdb" else "yaml"
    return "yaml"


def _name_and_kind(path: Path) -> tuple[str, str] | None:
    """`(name, kind)` for a file that can be (part of) a store; None for anything else."""
    lowered = path.name.lower()
    if path.name.startswith("."):
        return None
    for suffix in _QDRANT_SUFFIXES:
        if lowered.endswith(suffix):
            return path.name[: -len(suffix)], "qdrant"
    kind = {".lancedb": "lancedb", ".duckdb": "duckdb", ".yaml": "yaml", ".yml": "yaml"}.get(
        path.suffix.lower()
    )
    return (path.stem, kind) if kind else None


def _stores(name: str, paths: list[Path]) -> list[RagEntry]:
    """The stores one name's files make up (more than one means the name is ambiguous)."""
    stores: list[RagEntry] = []
    databases: list[Path] = []
    sidecars: list[Path] = []
    for path in sorted(paths):
        kind = _name_and_kind(path)
        assert kind is not None
        if kind[1] == "duckdb":
            databases.append(path)
        elif kind[1] == "yaml" and _yaml_driver(path) == "duckdb":
            sidecars.append(path)
        else:
            stores.append(RagEntry(name, kind[1], path, (path,)))
    if databases or sidecars:
        database = databases[0] if databases else sidecars[0].with_suffix(".duckdb")
        wal = database.with_name(database.name + ".wal")
        files = (*databases[:1], *([wal] if wal.exists() else []), *sidecars[:1])
        stores.append(RagEntry(name, "duckdb", database, files))
        # `kb.duckdb` + `kb.DUCKDB`, or `kb.yaml` + `kb.yml` sidecars: not one store
        extra = databases[1:] + sidecars[1:]
        stores.extend(RagEntry(name, "duckdb", path, (path,)) for path in extra)
    return stores


def _scan(directory: Path) -> dict[str, list[Path]]:
    """Store files in `directory` grouped by name (empty when it does not exist yet)."""
    groups: dict[str, list[Path]] = {}
    try:
        children = list(directory.iterdir())
    except FileNotFoundError:
        return groups
    except OSError as error:
        raise StoreError(f"Cannot list the rags dir {directory}: {error.strerror}") from None
    for path in children:
        found = _name_and_kind(path)
        if found is not None and found[0]:
            groups.setdefault(found[0], []).append(path)
    return groups


def _ambiguous(name: str, directory: Path, stores: list[RagEntry]) -> StoreError:
    files = ", ".join(sorted({str(path.name) for store in stores for path in store.files}))
    return StoreError(
        f"The name {name!r} is ambiguous in {directory}: {files} are different stores; "
        "rename or remove all but one, or open one with --db PATH"
    )


def _entries(directory: Path) -> Iterator[tuple[str, RagEntry | StoreError]]:
    for name, paths in sorted(_scan(directory).items()):
        stores = _stores(name, paths)
        yield name, stores[0] if len(stores) == 1 else _ambiguous(name, directory, stores)


def find_rag(name: str, config: AppConfig | None = None) -> RagEntry | None:
    """The existing knowledge base called `name`, or None; StoreError if ambiguous."""
    name = check_name(name)
    directory = rags_dir(config)
    paths = _scan(directory).get(name)
    if not paths:
        return None
    stores = _stores(name, paths)
    if len(stores) > 1:
        raise _ambiguous(name, directory, stores)
    return stores[0]


def resolve_rag(
    name: str,
    config: AppConfig | None = None,
    *,
    create: bool = False,
    driver: str | None = None,
) -> RagEntry:
    """Where the knowledge base `name` is, or (with `create`) where a new one goes.

    An existing one keeps its driver (`driver`, when given, must agree). A new one
    uses `driver`, else `storage.driver`, else lancedb; the store itself is made on
    the first writable open. Without `create`, a missing name is StoreNotFoundError.
    """
    config = config if config is not None else load_config()
    found = find_rag(name, config)
    directory = rags_dir(config)
    if found is not None:
        if driver is not None and driver != found.driver:
            raise StoreError(
                f"The knowledge base {name!r} ({found.location}) uses the {found.driver} "
                f"driver, not {driver}: drop the driver option, or choose another name"
            )
        return found
    if not create:
        known = sorted(_scan(directory))
        listed = f" (there are: {', '.join(known)})" if known else ""
        raise StoreNotFoundError(
            f"No knowledge base named {name!r} in {directory}{listed}; create it with "
            f"`haiku-rag --rag {name} add SOURCES` or HaikuRAG.open({name!r}, create=True)"
        )
    chosen = driver or config.storage.driver or DEFAULT_DRIVER
    if chosen not in CREATE_SUFFIXES:
        raise StoreError(
            f"Cannot create the knowledge base {name!r} with driver {chosen!r}: choose one of "
            f"{', '.join(DRIVER_CHOICES)} (a Qdrant collection is attached with "
            f"`haiku-rag attach {directory / name} ...`)"
        )
    return RagEntry(name, chosen, directory / f"{name}{CREATE_SUFFIXES[chosen]}")


def list_rags(config: AppConfig | None = None) -> list[RagEntry]:
    """Every unambiguous knowledge base in the rags dir, by name (see `describe_rags`)."""
    return [entry for _, entry in _entries(rags_dir(config)) if isinstance(entry, RagEntry)]


@dataclass(frozen=True)
class RagSummary:
    """One line of `haiku-rag rags`. Counts are None when unknown (see `error`)."""

    name: str
    driver: str | None
    location: str | None
    documents: int | None
    chunks: int | None
    size: int
    """Bytes on disk."""
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _counts(entry: RagEntry) -> tuple[int | None, int | None, str | None]:
    """Documents and chunks, read through the driver without loading an embedder."""
    if entry.driver == "qdrant":
        return None, None, "remote collection: not contacted (use `--rag NAME info`)"
    from haiku.rag.store import driver_class

    try:
        store = driver_class(entry.driver).open(str(entry.location), read_only=True)
    except Exception as error:  # one unreadable store must not hide the others
        return None, None, _describe_error(error)
    try:
        return store.count_documents(), store.count_chunks(), None
    except Exception as error:
        return None, None, _describe_error(error)
    finally:
        store.close()


def _describe_error(error: Exception) -> str:
    return str(error) if isinstance(error, HaikuRAGError) else f"{type(error).__name__}: {error}"


def describe_rags(config: AppConfig | None = None) -> list[RagSummary]:
    """Name, driver, counts and size of every knowledge base in the rags dir.

    Blocking (opens each local store read-only). A store that cannot be read, or a
    name shared by two stores, is listed with its `error` instead of failing the list.
    """
    summaries = []
    for name, entry in _entries(rags_dir(config)):
        if isinstance(entry, StoreError):
            summaries.append(RagSummary(name, None, None, None, None, 0, str(entry)))
            continue
        documents, chunks, error = _counts(entry)
        summaries.append(
            RagSummary(
                name, entry.driver, str(entry.location), documents, chunks, entry.size, error
            )
        )
    return summaries
