"""Read-only attach of an existing Qdrant collection, spoken to over its REST API with httpx.

What the driver expects of the collection (checked by `attach` and on open):

- a single unnamed dense vector (named-vector and multi-vector collections are refused);
  Cosine distance, or Dot / Euclid over L2-normalised vectors (scores are turned into
  cosine similarity); Manhattan is refused;
- chunk text in a `page_content` payload field, the document in `metadata.source` (a
  string or an integer; when absent the point id is the document's uri), optional
  `metadata.title` and `metadata.start_index` (the LangChain conventions);
- integer or UUID point ids. A chunk id is the point id as a string (`"42"`, or the
  canonical lowercase UUID), turned back into an int or UUID when fetching by id.

**The embedding model must be the one that built the collection.** Qdrant only stores
vectors; nothing in the collection says which model made them, so the attach file records
the model you name and queries are embedded with it. A different model of the same
dimension gives meaningless rankings without any error.

Where a collection is named:

- an attach file `NAME.qdrant.yaml` (written by `attach`, `haiku-rag attach`) holding host,
  port, https, collection, the *name* of the environment variable with the API key (the key
  itself is never written), timeout, catalogue_limit and the store settings;
- or a direct URL, `qdrant://host[:port]/collection` (http), `http(s)://host[:port]/collection`,
  with optional `?api_key_env=NAME`; the embedding model then comes from the caller
  (`QdrantStore.open(url, embedding_model=...)`, i.e. the config's `embeddings.model`).

Costs. Vector search, `get_chunks` and `count_chunks` are one request each. Everything that
needs documents (listing, counts, hashes, filtering by document, BM25) needs the points
grouped by source, which Qdrant cannot do without a payload index we may not create: the
driver scrolls the whole collection once (text and payload, no vectors; pages of 512
points) into an in-memory catalogue, lazily on first use and then cached for the life of
the opened store (a snapshot: reopen to see new points). This is bounded by
`catalogue_limit` (default 20 000 points, set in the attach file). Larger collections keep
vector search and `get_chunks`; `get_document`/`document_chunks` work for documents already
seen in results (one filtered scroll each); listing, counting and hashing documents, and
BM25, raise a StoreError that names the limit.

Keyword search (BM25) is built without writing to Qdrant: an in-RAM tantivy index over the
catalogue (the shared `store._tantivy` index, analysed like LanceDB's FTS), so
`features.keyword_search` is true exactly when the collection has at most `catalogue_limit`
points at open time.

Networking. Hosts on loopback, private ranges (10/8, 172.16/12, 192.168/16, 169.254/16,
fc00::/7, fe80::/10), `localhost` and `.local` names are reached directly, ignoring
HTTP(S)_PROXY; other hosts honour the proxy environment. Timeouts and HTTP errors become a
StoreError naming the host (and the status and Qdrant's own message). The `api-key` header
is read from the named environment variable at each request. Needs Qdrant 1.10 or later
(`points/query`).

Tested only against a loopback server speaking the Qdrant REST API (tests/qdrant_server.py,
backed by qdrant-client's local mode), not against a live Qdrant server.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from haiku.rag.documents import Chunk, Document, document_id_for, sha256_hex
from haiku.rag.errors import ReadOnlyError, StoreError, StoreNotFoundError
from haiku.rag.store._tantivy import KeywordIndex
from haiku.rag.store.base import Ranked, StoreFeatures, StoreSettings

DRIVER = "qdrant"
ATTACH_SUFFIX = ".qdrant.yaml"
ATTACH_SUFFIXES = (".qdrant.yaml", ".qdrant.yml")
URL_SCHEMES = ("qdrant", "http", "https")
DEFAULT_PORT = 6333
DEFAULT_TIMEOUT = 10.0
CATALOGUE_LIMIT = 20_000
"""Collections up to this many points are catalogued in RAM (documents, BM25)."""
SCROLL_PAGE = 512
SAMPLE_POINTS = 16
MIN_SERVER_VERSION = (1, 10)
TEXT_FIELD = "page_content"

READ_ONLY = (
    "an attached Qdrant collection is read-only: haiku.rag searches it but never writes to "
    "it; to add or change documents, update the collection with the tool that built it, or "
    "add them to a lancedb/yaml/duckdb knowledge base instead"
)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NO_PROXY_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in (
        "127.0.0.0/8",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "::1/128",
        "fc00::/7",
        "fe80::/10",
    )
)


def bypass_proxy(host: str) -> bool:
    """True for hosts a proxy cannot (or should not) reach: loopback, private, `.local`.

    Pure: decided from the name alone, without a DNS lookup.
    """
    name = host.strip().strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith((".localhost", ".local")):
        return True
    try:
        address = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in _NO_PROXY_NETWORKS)


def is_attach_file(path: str | Path) -> bool:
    return str(path).lower().endswith(ATTACH_SUFFIXES)


def is_url(path: str | Path) -> bool:
    """`qdrant://`, `http://` or `https://` (also after pathlib collapsed `//` into `/`)."""
    scheme, sep, _ = str(path).partition(":")
    return bool(sep) and scheme.lower() in URL_SCHEMES


def attach_path(name: str | Path) -> Path:
    """`NAME` -> `NAME.qdrant.yaml`; a name that already ends in the suffix is kept."""
    path = Path(name).expanduser()
    return path if is_attach_file(path) else path.with_name(path.name + ATTACH_SUFFIX)


# --- where the collection is ---------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    https: bool
    collection: str
    api_key_env: str | None = None
    timeout: float = DEFAULT_TIMEOUT

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.https else 'http'}://{host}:{self.port}"

    @property
    def label(self) -> str:
        """How errors name the server: `host:port`."""
        return self.base_url.split("://", 1)[1]

    @property
    def url(self) -> str:
        return f"{self.base_url}/{quote(self.collection, safe='')}"


def split_host(host: str, port: int | None = None, https: bool = False) -> tuple[str, int, bool]:
    """`host`, `host:port`, `[v6]:port` or `http(s)://host[:port]` -> (host, port, https)."""
    text = host.strip()
    if not text:
        raise StoreError("No Qdrant host given: pass e.g. --host localhost:6333")
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if scheme not in ("http", "https"):
            raise StoreError(f"Qdrant host {host!r}: use http:// or https://, not {scheme}://")
        https = https or scheme == "https"
        text = text.split("://", 1)[1]
    text = text.rstrip("/")
    try:
        parsed = urlsplit(f"//{text}")
        name, given_port = parsed.hostname, parsed.port
    except ValueError as error:
        raise StoreError(f"Invalid Qdrant host {host!r}: {error}") from None
    if not name or parsed.path:
        raise StoreError(f"Invalid Qdrant host {host!r}: expected HOST or HOST:PORT")
    if given_port is not None and port is not None and given_port != port:
        raise StoreError(f"Qdrant host {host!r} names port {given_port} but port={port} was given")
    return name, given_port or port or DEFAULT_PORT, https


def parse_url(url: str) -> Endpoint:
    """`qdrant://host:port/collection?api_key_env=NAME` (or http/https) -> Endpoint."""
    scheme, _, rest = str(url).partition(":")
    rest = rest.lstrip("/")  # pathlib turns "qdrant://h/c" into "qdrant:/h/c"
    parts = urlsplit(f"//{rest}")
    collection = parts.path.strip("/")
    if not collection or "/" in collection:
        raise StoreError(f"Invalid Qdrant URL {url!r}: expected {scheme}://host:port/collection")
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    unknown = sorted(set(query) - {"api_key_env", "timeout"})
    if unknown:
        raise StoreError(
            f"Invalid Qdrant URL {url!r}: unknown parameter(s) {', '.join(unknown)}; "
            f"known: api_key_env, timeout"
        )
    host, port, https = split_host(parts.netloc, None, scheme.lower() == "https")
    api_key_env = query.get("api_key_env")
    if api_key_env is not None:
        check_env_name(api_key_env)
    try:
        timeout = float(query.get("timeout", DEFAULT_TIMEOUT))
    except ValueError:
        raise StoreError(f"Invalid Qdrant URL {url!r}: timeout must be seconds") from None
    return Endpoint(host, port, https, collection, api_key_env, timeout)


def check_env_name(name: str) -> None:
    """Refuse what looks like a key rather than a variable name, so it never reaches disk."""
    if not _ENV_NAME.fullmatch(name):
        raise StoreError(
            f"api_key_env must be the NAME of an environment variable holding the key "
            f"(like QDRANT_API_KEY), not {'the key itself' if len(name) > 8 else repr(name)}"
        )


# --- HTTP ------------------------------------------------------------------------------


class _NotFound(StoreError):
    """Qdrant answered 404 (an unknown collection)."""


class QdrantHTTP:
    """The few REST calls the driver makes, with every failure turned into a StoreError."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        # A transport of our own turns off httpx's environment proxies (and only them:
        # SSL_CERT_FILE and friends still apply).
        transport = httpx.HTTPTransport() if bypass_proxy(endpoint.host) else None
        self._client = httpx.Client(
            base_url=endpoint.base_url,
            timeout=endpoint.timeout,
            transport=transport,
            headers={"accept": "application/json"},
        )

    def close(self) -> None:
        self._client.close()

    def _headers(self) -> dict[str, str]:
        name = self.endpoint.api_key_env
        if name is None:
            return {}
        key = os.environ.get(name)
        if not key:
            raise StoreError(
                f"The environment variable {name} is not set: it should hold the API key "
                f"for Qdrant at {self.endpoint.label} (only its name is stored); export it "
                f"and retry"
            )
        return {"api-key": key}

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The decoded JSON body; raises StoreError on any failure."""
        where = self.endpoint.label
        try:
            response = self._client.request(method, path, json=body, headers=self._headers())
        except httpx.TimeoutException:
            raise StoreError(
                f"Qdrant at {where} did not answer {method} {path} within "
                f"{self.endpoint.timeout:g}s: check the server, or raise `timeout` in the "
                f"attach file"
            ) from None
        except httpx.HTTPError as error:
            raise StoreError(
                f"Cannot reach Qdrant at {where}: {error or type(error).__name__}; check the "
                f"host, port and https setting, and that the server is running"
            ) from None
        if response.status_code >= 400:
            raise self._http_error(method, path, response)
        try:
            return response.json()
        except ValueError:
            raise StoreError(
                f"Qdrant at {where} answered {method} {path} with something that is not "
                f"JSON (is it a Qdrant server?): {response.text[:200]!r}"
            ) from None

    def result(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The `result` of Qdrant's `{"result": ..., "status": "ok", "time": ...}` envelope."""
        data = self.call(method, path, body)
        if not isinstance(data, dict) or "result" not in data:
            raise StoreError(
                f"Qdrant at {self.endpoint.label} answered {method} {path} without a "
                f"`result`: {str(data)[:200]}"
            )
        return data["result"]

    def _http_error(self, method: str, path: str, response: httpx.Response) -> StoreError:
        message = response.text.strip()
        try:
            status = response.json().get("status")
            if isinstance(status, dict) and status.get("error"):
                message = str(status["error"])
        except (ValueError, AttributeError):
            pass
        text = (
            f"Qdrant at {self.endpoint.label} answered {response.status_code} to "
            f"{method} {path}: {message[:300] or response.reason_phrase}"
        )
        if response.status_code in (401, 403):
            name = self.endpoint.api_key_env
            text += (
                f" (the API key in ${name} was refused)"
                if name
                else " (the server wants an API key: attach with --api-key-env NAME)"
            )
        cls = _NotFound if response.status_code == 404 else StoreError
        return cls(text)


# --- validating a collection -----------------------------------------------------------


@dataclass(frozen=True)
class CollectionShape:
    """What `describe_collection` learnt: enough to search it and to report on attach."""

    dimension: int
    distance: str
    points: int
    id_kind: str = "unknown"
    server_version: str | None = None
    warnings: tuple[str, ...] = ()


def _version_tuple(version: str) -> tuple[int, ...] | None:
    match = re.match(r"v?(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def _vector_params(endpoint: Endpoint, info: dict[str, Any]) -> tuple[int, str]:
    """(dimension, distance) of a single unnamed vector, or the reason the collection won't do."""
    name = f"Qdrant collection {endpoint.collection!r} at {endpoint.label}"
    vectors = (info.get("config") or {}).get("params", {}).get("vectors")
    if not isinstance(vectors, dict) or not vectors:
        raise StoreError(
            f"{name} has no dense vector (sparse-only collections cannot be searched by "
            f"haiku.rag): attach a collection with a single unnamed vector"
        )
    if "size" not in vectors:
        names = ", ".join(sorted(vectors))
        raise StoreError(
            f"{name} has named vectors ({names}); haiku.rag attaches collections with a "
            f"single unnamed vector, as LangChain and LlamaIndex create them"
        )
    if vectors.get("multivector_config"):
        raise StoreError(
            f"{name} is a multi-vector collection (one vector list per point, "
            f"late-interaction); haiku.rag needs a single vector per point"
        )
    distance = str(vectors.get("distance", "Cosine"))
    if distance == "Manhattan":
        raise StoreError(
            f"{name} uses Manhattan distance, which cannot be turned into the cosine "
            f"similarity haiku.rag ranks by; use a Cosine, Dot or Euclid collection"
        )
    return int(vectors["size"]), distance


def describe_collection(http: QdrantHTTP, *, sample: bool) -> CollectionShape:
    """Check that the server answers and the collection can be attached; raise why not."""
    endpoint = http.endpoint
    root = http.call("GET", "/")
    version = root.get("version") if isinstance(root, dict) else None
    parsed = _version_tuple(str(version)) if version else None
    if parsed is not None and parsed < MIN_SERVER_VERSION:
        raise StoreError(
            f"Qdrant at {endpoint.label} runs version {version}; haiku.rag queries with "
            f"points/query, which needs Qdrant 1.10 or later"
        )
    try:
        info = http.result("GET", _collection_path(endpoint))
    except _NotFound:
        names = [c.get("name") for c in http.result("GET", "/collections").get("collections", [])]
        known = ", ".join(sorted(str(n) for n in names)) or "none"
        raise StoreError(
            f"Qdrant at {endpoint.label} has no collection {endpoint.collection!r} "
            f"(collections there: {known})"
        ) from None
    dimension, distance = _vector_params(endpoint, info)
    points = int(info.get("points_count") or 0)
    warnings: list[str] = []
    if distance in ("Dot", "Euclid"):
        warnings.append(
            f"collection uses {distance} distance: scores are read as cosine similarity, "
            f"which holds only if its vectors are L2-normalised"
        )
    if not sample:
        return CollectionShape(dimension, distance, points, server_version=version)
    body = {"limit": SAMPLE_POINTS, "with_payload": True, "with_vector": False}
    sampled = http.result("POST", f"{_collection_path(endpoint)}/points/scroll", body)
    kinds = set()
    for point in sampled.get("points", []):
        kinds.add("integer" if isinstance(point.get("id"), int) else "UUID")
        payload = point.get("payload") or {}
        if not isinstance(payload.get(TEXT_FIELD), str):
            keys = ", ".join(sorted(payload)) or "none"
            raise StoreError(
                f"Point {point.get('id')} of Qdrant collection {endpoint.collection!r} has no "
                f"text in a {TEXT_FIELD!r} payload field (its payload keys: {keys}); haiku.rag "
                f"reads chunk text from {TEXT_FIELD!r} (the LangChain convention)"
            )
    if not kinds:
        points = 0
        warnings.append(
            f"collection {endpoint.collection!r} is empty: searches return nothing until "
            f"points are added to it"
        )
    id_kind = " and ".join(sorted(kinds)) if kinds else "none"
    return CollectionShape(dimension, distance, points, id_kind, version, tuple(warnings))


def _collection_path(endpoint: Endpoint) -> str:
    return f"/collections/{quote(endpoint.collection, safe='')}"


# --- the attach file -------------------------------------------------------------------


class AttachFile(BaseModel):
    """`NAME.qdrant.yaml`: where the collection is and what built it; never the key."""

    model_config = ConfigDict(extra="forbid")

    driver: Literal["qdrant"] = "qdrant"
    host: str
    port: int = Field(DEFAULT_PORT, gt=0, lt=65536)
    https: bool = False
    collection: str
    api_key_env: str | None = None
    timeout: float = Field(DEFAULT_TIMEOUT, gt=0)
    catalogue_limit: int = Field(CATALOGUE_LIMIT, ge=0)
    settings: StoreSettings

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(
            self.host, self.port, self.https, self.collection, self.api_key_env, self.timeout
        )

    def dump(self) -> str:
        header = (
            "# haiku.rag attach file: a read-only Qdrant collection (see `haiku-rag attach`).\n"
            "# api_key_env names the environment variable holding the API key; the key is\n"
            "# never written here. settings.embedding_model must be the model that built\n"
            "# the collection.\n"
        )
        return header + yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @classmethod
    def read(cls, path: Path) -> AttachFile:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise StoreNotFoundError(
                f"No Qdrant attach file at {path}: create it with "
                f"`haiku-rag attach NAME --host HOST --collection C`"
            ) from None
        except OSError as error:
            raise StoreError(f"Cannot read attach file {path}: {error.strerror}") from None
        try:
            return cls.model_validate(yaml.safe_load(text))
        except (yaml.YAMLError, ValidationError) as error:
            raise StoreError(
                f"{path} is not a valid Qdrant attach file ({error}); re-create it with "
                f"`haiku-rag attach`"
            ) from None


@dataclass
class AttachReport:
    """What `attach` found, for the CLI and for callers that check it."""

    path: Path
    url: str
    collection: str
    dimension: int
    distance: str
    points: int
    id_kind: str
    server_version: str | None
    embedding_model: str
    keyword_search: bool
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        bm25 = "bm25 (in-memory tantivy)" if self.keyword_search else "no bm25 (too many points)"
        return [
            f"Attached {self.url} as {self.path}",
            f"  {self.points} points, {self.dimension}-dimensional vectors ({self.distance}), "
            f"{self.id_kind} ids, Qdrant {self.server_version or 'version unknown'}",
            f"  queries embedded with {self.embedding_model} (must be the collection's model)",
            f"  signals: vector, {bm25}",
        ]


def attach(
    path: str | Path,
    host: str,
    collection: str,
    *,
    embedding_model: str,
    port: int | None = None,
    https: bool = False,
    api_key_env: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    catalogue_limit: int = CATALOGUE_LIMIT,
    overwrite: bool = False,
) -> AttachReport:
    """Validate a Qdrant collection and save an attach file for it at `path`."""
    path = Path(path).expanduser()
    if not is_attach_file(path):
        raise StoreError(
            f"Attach files end in {ATTACH_SUFFIX} so the driver is recognised: use "
            f"{attach_path(path)}"
        )
    if path.exists() and not overwrite:
        raise StoreError(f"{path} already exists: pass --force (overwrite=True) to replace it")
    if ":" not in embedding_model:
        raise StoreError(
            f"embedding model {embedding_model!r} needs a provider prefix, e.g. "
            f"'local:all-MiniLM-L6-v2'"
        )
    if api_key_env is not None:
        check_env_name(api_key_env)
    name, port, https = split_host(host, port, https)
    endpoint = Endpoint(name, port, https, collection, api_key_env, timeout)
    http = QdrantHTTP(endpoint)
    try:
        shape = describe_collection(http, sample=True)
    finally:
        http.close()
    warnings = list(shape.warnings)
    if api_key_env and not https and not bypass_proxy(name):
        warnings.append(f"the API key is sent over plain http to {endpoint.label}: use https")
    record = AttachFile(
        host=name,
        port=port,
        https=https,
        collection=collection,
        api_key_env=api_key_env,
        timeout=timeout,
        catalogue_limit=catalogue_limit,
        settings=_settings(embedding_model, shape.dimension),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(record.dump(), encoding="utf-8")
    temp.replace(path)
    return AttachReport(
        path=path,
        url=endpoint.url,
        collection=collection,
        dimension=shape.dimension,
        distance=shape.distance,
        points=shape.points,
        id_kind=shape.id_kind,
        server_version=shape.server_version,
        embedding_model=embedding_model,
        keyword_search=shape.points <= catalogue_limit,
        warnings=warnings,
    )


def attach_command(
    name: str,
    host: str,
    collection: str,
    *,
    api_key_env: str | None = None,
    https: bool = False,
    embedding_model: str | None = None,
    config: Any = None,
    timeout: float = DEFAULT_TIMEOUT,
    force: bool = False,
    echo: Callable[[str], None] = print,
    warn: Callable[[str], None] | None = None,
) -> AttachReport:
    """`haiku-rag attach NAME --host HOST[:PORT] --collection C [--api-key-env VAR]`.

    Writes `NAME.qdrant.yaml` (relative to the working directory). The model defaults to
    the config's `embeddings.model`; errors are raised (the CLI prints them as one line),
    the report goes to `echo` and warnings, prefixed `warning: `, to `warn` (default echo).
    """
    from haiku.rag.config import load_config

    config = config if config is not None else load_config()
    model = embedding_model or config.embeddings.model
    report = attach(
        attach_path(name),
        host,
        collection,
        embedding_model=model,
        https=https,
        api_key_env=api_key_env,
        timeout=timeout,
        overwrite=force,
    )
    dimension = config.embeddings.dimension
    if dimension is not None and dimension != report.dimension:
        report.warnings.append(
            f"the config sets embeddings.dimension to {dimension} but the collection holds "
            f"{report.dimension}-dimensional vectors: opening it will fail until they agree"
        )
    for line in report.lines():
        echo(line)
    for warning in report.warnings:
        (warn or echo)(f"warning: {warning}")
    return report


def _settings(embedding_model: str, dimension: int) -> StoreSettings:
    # Chunking is whatever built the collection; unknown, so 0.
    return StoreSettings(
        driver=DRIVER,
        embedding_model=embedding_model,
        embedding_dim=dimension,
        chunk_size=0,
        chunk_overlap=0,
    )


# --- ids and payloads ------------------------------------------------------------------

PointId = int | str


def point_id(chunk_id: str) -> PointId | None:
    """A chunk id back to the point id it came from; None if it cannot be one."""
    if chunk_id.isascii() and chunk_id.isdigit():
        number = int(chunk_id)
        return number if str(number) == chunk_id and number < 2**64 else None
    try:
        canonical = str(uuid.UUID(chunk_id))
    except ValueError:
        return None
    return canonical if canonical == chunk_id else None


@dataclass(frozen=True)
class _Point:
    """One point's payload, read the way the driver maps it to a chunk and a document."""

    id: PointId
    text: str
    source: str | int | None
    metadata: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Point:
        payload = data.get("payload") or {}
        metadata = payload.get("metadata")
        metadata = dict(metadata) if isinstance(metadata, dict) else {}
        source = metadata.get("source")
        if isinstance(source, bool) or not isinstance(source, str | int) or source == "":
            source = None
        text = payload.get(TEXT_FIELD)
        return cls(data["id"], text if isinstance(text, str) else "", source, metadata)

    @property
    def chunk_id(self) -> str:
        return str(self.id)

    @property
    def uri(self) -> str:
        return str(self.source) if self.source is not None else self.chunk_id

    @property
    def document_id(self) -> str:
        return document_id_for(self.uri)

    @property
    def start(self) -> int | None:
        start = self.metadata.get("start_index")
        return start if isinstance(start, int) and not isinstance(start, bool) else None

    def chunk(self, order: int) -> Chunk:
        return Chunk(
            id=self.chunk_id,
            document_id=self.document_id,
            order=order,
            content=self.text,
            start=self.start or 0,
        )


@dataclass(frozen=True)
class _DocKey:
    """How to select one document's points in a Qdrant filter."""

    source: str | int | None
    point: PointId | None = None


def _filter(keys: Collection[_DocKey]) -> dict[str, Any]:
    strings = sorted({k.source for k in keys if isinstance(k.source, str)})
    numbers = sorted({k.source for k in keys if isinstance(k.source, int)})
    ids = [k.point for k in keys if k.source is None]
    should: list[dict[str, Any]] = [
        {"key": "metadata.source", "match": {"any": values}}
        for values in (strings, numbers)
        if values
    ]
    if ids:
        should.append({"has_id": ids})
    return {"should": should}


def _document(points: Sequence[_Point]) -> tuple[Document, list[Chunk]]:
    """Group one source's points into a Document and its ordered chunks.

    Order: `metadata.start_index` where present, else the order the points came in.
    Content is the chunk texts joined by blank lines (overlapping chunks repeat text).
    """
    ordered = sorted(points, key=lambda p: p.start if p.start is not None else math.inf)
    chunks = [point.chunk(order) for order, point in enumerate(ordered)]
    content = "\n\n".join(chunk.content for chunk in chunks)
    first = ordered[0]
    title = first.metadata.get("title")
    document = Document(
        id=first.document_id,
        uri=first.uri,
        title=title if isinstance(title, str) else None,
        content=content,
        metadata=first.metadata,
        content_hash=sha256_hex(content),
    )
    return document, chunks


@dataclass
class _Catalogue:
    """Every point's text and source, grouped into documents (see the module's Costs)."""

    documents: dict[str, Document]
    chunks: dict[str, Chunk]
    document_chunks: dict[str, list[str]]
    keys: dict[str, list[_DocKey]]
    keyword: KeywordIndex

    @classmethod
    def build(cls, points: Sequence[_Point]) -> _Catalogue:
        groups: dict[str, list[_Point]] = {}
        keys: dict[str, list[_DocKey]] = {}
        for point in points:
            groups.setdefault(point.document_id, []).append(point)
            key = _DocKey(point.source, point.id if point.source is None else None)
            if key not in keys.setdefault(point.document_id, []):
                keys[point.document_id].append(key)
        documents: dict[str, Document] = {}
        chunks: dict[str, Chunk] = {}
        document_chunks: dict[str, list[str]] = {}
        for document_id, group in groups.items():
            document, doc_chunks = _document(group)
            documents[document_id] = document
            document_chunks[document_id] = [chunk.id for chunk in doc_chunks]
            chunks.update((chunk.id, chunk) for chunk in doc_chunks)
        ordered = dict(sorted(documents.items(), key=lambda item: item[1].uri))
        keyword = KeywordIndex((c.id, c.content, c.document_id) for c in chunks.values())
        return cls(ordered, chunks, document_chunks, keys, keyword)


# --- the store -------------------------------------------------------------------------


def _score(distance: str, score: float) -> float:
    """Qdrant's score as cosine similarity (higher is better) for unit vectors."""
    return 1.0 - score * score / 2.0 if distance == "Euclid" else score


class QdrantStore:
    """A Qdrant collection attached read-only; see the module docstring for the mapping."""

    driver: ClassVar[str] = DRIVER

    def __init__(
        self,
        path: str,
        endpoint: Endpoint,
        settings: StoreSettings,
        shape: CollectionShape,
        catalogue_limit: int = CATALOGUE_LIMIT,
    ) -> None:
        self.path = path
        self.read_only = True
        self.endpoint = endpoint
        self.catalogue_limit = catalogue_limit
        self.shape = shape
        self._settings = settings
        self._http = QdrantHTTP(endpoint)
        self._small = shape.points <= catalogue_limit
        self.features = StoreFeatures(writable=False, keyword_search=self._small, graph=False)
        self._catalogue_cache: _Catalogue | None = None
        self._lock = threading.Lock()
        self._seen: dict[str, _DocKey] = {}
        """Documents met in results, so large collections can still fetch them."""

    # lifecycle ---------------------------------------------------------------------

    @classmethod
    def create(cls, path: str, settings: StoreSettings) -> QdrantStore:
        raise ReadOnlyError(
            f"Cannot create {path}: {READ_ONLY}. Attach an existing collection with "
            f"`haiku-rag attach NAME --host HOST --collection C`"
        )

    @classmethod
    def open(
        cls, path: str, *, read_only: bool = True, embedding_model: str | None = None
    ) -> QdrantStore:
        """Open an attach file or a `qdrant://host:port/collection` URL (always read-only).

        `embedding_model` is required for a URL (nothing records it there) and, for an
        attach file, must agree with the recorded one when given.
        """
        if is_url(path):
            endpoint = parse_url(path)
            if embedding_model is None:
                raise StoreError(
                    f"{path} does not say which embedding model built the collection: pass "
                    f"embedding_model (the config's embeddings.model), or attach it with "
                    f"`haiku-rag attach`"
                )
            http = QdrantHTTP(endpoint)
            try:
                shape = describe_collection(http, sample=True)
            finally:
                http.close()
            return cls(str(path), endpoint, _settings(embedding_model, shape.dimension), shape)
        record = AttachFile.read(Path(path))
        settings = record.settings
        if embedding_model is not None and embedding_model != settings.embedding_model:
            raise StoreError(
                f"{path} was attached with embedding model {settings.embedding_model!r} but "
                f"{embedding_model!r} was asked for: the model must be the one that built "
                f"the collection; re-attach with --force to change it"
            )
        http = QdrantHTTP(record.endpoint)
        try:
            shape = describe_collection(http, sample=False)
        finally:
            http.close()
        if shape.dimension != settings.embedding_dim:
            raise StoreError(
                f"Qdrant collection {record.collection!r} at {record.endpoint.label} now holds "
                f"{shape.dimension}-dimensional vectors, but {path} was attached at "
                f"{settings.embedding_dim}: re-attach it with --force"
            )
        return cls(str(path), record.endpoint, settings, shape, record.catalogue_limit)

    @property
    def settings(self) -> StoreSettings:
        return self._settings

    def close(self) -> None:
        self._http.close()

    # requests ----------------------------------------------------------------------

    def _post(self, suffix: str, body: dict[str, Any]) -> Any:
        return self._http.result("POST", f"{_collection_path(self.endpoint)}{suffix}", body)

    def _scroll(self, filter: dict[str, Any] | None = None) -> Iterator[_Point]:
        offset: Any = None
        while True:
            body: dict[str, Any] = {
                "limit": SCROLL_PAGE,
                "with_payload": True,
                "with_vector": False,
            }
            if offset is not None:
                body["offset"] = offset
            if filter is not None:
                body["filter"] = filter
            page = self._post("/points/scroll", body)
            for data in page.get("points", []):
                yield self._remember(_Point.from_json(data))
            offset = page.get("next_page_offset")
            if offset is None:
                return

    def _remember(self, point: _Point) -> _Point:
        self._seen.setdefault(
            point.document_id, _DocKey(point.source, point.id if point.source is None else None)
        )
        return point

    def _too_large(self, what: str) -> StoreError:
        return StoreError(
            f"Cannot {what} on Qdrant collection {self.endpoint.collection!r}: it holds "
            f"{self.shape.points} points, more than the catalogue_limit of "
            f"{self.catalogue_limit} this driver scans into memory. Vector search still "
            f"works; raise catalogue_limit in {self.path} to allow it (one scroll of the "
            f"whole collection, its text kept in memory)"
        )

    def _catalogue(self, what: str) -> _Catalogue:
        if not self._small:
            raise self._too_large(what)
        with self._lock:
            if self._catalogue_cache is None:
                points: list[_Point] = []
                for point in self._scroll():
                    points.append(point)
                    if len(points) > self.catalogue_limit:  # grew since open
                        self._small = False
                        self.features = StoreFeatures(False, keyword_search=False, graph=False)
                        raise self._too_large(what)
                self._catalogue_cache = _Catalogue.build(points)
            return self._catalogue_cache

    # documents ---------------------------------------------------------------------

    def list_documents(self, limit: int | None = None, offset: int = 0) -> list[Document]:
        """Documents by uri; costs the catalogue scan the first time."""
        documents = list(self._catalogue("list documents").documents.values())
        return documents[offset : None if limit is None else offset + limit]

    def _fetch_document(self, document_id: str) -> tuple[Document, list[Chunk]] | None:
        if self._small:
            catalogue = self._catalogue("look up documents")
            document = catalogue.documents.get(document_id)
            if document is None:
                return None
            return document, [catalogue.chunks[c] for c in catalogue.document_chunks[document_id]]
        key = self._seen.get(document_id)
        if key is None:
            return None
        points = list(self._scroll(_filter([key])))
        return _document(points) if points else None

    def get_documents(self, document_ids: Sequence[str]) -> list[Document]:
        found = (self.get_document(document_id) for document_id in dict.fromkeys(document_ids))
        return [document for document in found if document is not None]

    def get_document(self, document_id: str) -> Document | None:
        found = self._fetch_document(document_id)
        return found[0] if found else None

    def document_chunks(self, document_id: str) -> list[Chunk]:
        found = self._fetch_document(document_id)
        return found[1] if found else []

    def document_hashes(self) -> dict[str, str]:
        catalogue = self._catalogue("list document hashes")
        return {doc.uri: doc.content_hash for doc in catalogue.documents.values()}

    def count_documents(self) -> int:
        return len(self._catalogue("count documents").documents)

    def count_chunks(self) -> int:
        return int(self._post("/points/count", {"exact": True})["count"])

    # chunks ------------------------------------------------------------------------

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[Chunk]:
        """From the catalogue when there is one; points it lacks are fetched by id."""
        found: dict[str, Chunk] = {}
        if self._small:
            chunks = self._catalogue("read chunks").chunks
            found = {cid: chunks[cid] for cid in chunk_ids if cid in chunks}
        missing = [
            pid
            for cid in dict.fromkeys(chunk_ids)
            if cid not in found and (pid := point_id(cid)) is not None
        ]
        if missing:
            body = {"ids": missing, "with_payload": True, "with_vector": False}
            for data in self._post("/points", body):
                point = self._remember(_Point.from_json(data))
                found[point.chunk_id] = point.chunk(0)
        return [found[cid] for cid in chunk_ids if cid in found]

    # writes ------------------------------------------------------------------------

    def write(
        self, documents: Sequence[Document], chunks: Sequence[Chunk], vectors: np.ndarray
    ) -> None:
        raise ReadOnlyError(f"Cannot write to {self.path}: {READ_ONLY}")

    def delete_documents(self, document_ids: Collection[str]) -> int:
        raise ReadOnlyError(f"Cannot delete from {self.path}: {READ_ONLY}")

    def save_graph(self, data: dict[str, Any]) -> None:
        raise ReadOnlyError(f"Cannot save a knowledge graph in {self.path}: {READ_ONLY}")

    def load_graph(self) -> dict[str, Any] | None:
        return None

    # search ------------------------------------------------------------------------

    def _keys_for(self, document_ids: Collection[str]) -> list[_DocKey]:
        if self._small:
            keys = self._catalogue("filter by document").keys
            return [key for doc in document_ids for key in keys.get(doc, [])]
        unknown = [doc for doc in document_ids if doc not in self._seen]
        if unknown:
            raise self._too_large(f"filter by unseen document {unknown[0]}")
        return [self._seen[doc] for doc in document_ids]

    def vector_search(
        self, vector: np.ndarray, limit: int, document_ids: Collection[str] | None = None
    ) -> Ranked:
        values = np.asarray(vector, dtype=np.float32).ravel()
        if values.shape[0] != self._settings.embedding_dim:
            raise StoreError(
                f"Query vector has {values.shape[0]} dimensions but Qdrant collection "
                f"{self.endpoint.collection!r} holds {self._settings.embedding_dim}: embed "
                f"queries with {self._settings.embedding_model}"
            )
        if limit <= 0:
            return []
        body: dict[str, Any] = {"query": values.tolist(), "limit": limit, "with_payload": False}
        if document_ids is not None:
            keys = self._keys_for(document_ids)
            if not keys:
                return []
            body["filter"] = _filter(keys)
        points = self._post("/points/query", body).get("points", [])
        distance = self.shape.distance
        return [(str(p["id"]), _score(distance, float(p["score"]))) for p in points]

    def keyword_search(
        self, query: str, limit: int, document_ids: Collection[str] | None = None
    ) -> Ranked:
        """BM25 over the catalogue (in-RAM tantivy); unavailable past catalogue_limit."""
        return self._catalogue("run keyword search").keyword.search(query, limit, document_ids)
