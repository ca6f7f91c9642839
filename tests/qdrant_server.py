"""A loopback server speaking the part of Qdrant's REST API the qdrant driver uses.

Requests are answered by `qdrant_client.QdrantClient(":memory:")` (local mode, test-only)
and translated to the JSON shapes a real Qdrant returns: `{"result": ..., "status": "ok",
"time": ...}`, `{"status": {"error": ...}, "time": ...}` with 404 for an unknown collection,
optional fields left out rather than null, `next_page_offset: null` at the end of a scroll.

It also lets tests inject what a real deployment does to clients: an API key requirement
(401 with Qdrant's plain-text message), failures (any status, Qdrant's error body), slow
answers, and forward-proxy requests (absolute-form request lines, recorded in `proxied`
and then answered as if they had reached Qdrant).
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import ValidationError
from qdrant_client import QdrantClient, models

VERSION = "1.15.1"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Fault:
    """Answer requests whose path contains `path` with `status` (once, or `times`);
    `raw` sends `message` as the whole body instead of Qdrant's error JSON."""

    status: int
    message: str
    path: str = ""
    times: int = 1
    raw: bool = False


class QdrantError(Exception):
    def __init__(self, status: int, message: str, raw: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.raw = raw


@dataclass
class QdrantTestServer:
    client: QdrantClient = field(default_factory=lambda: QdrantClient(":memory:"))
    api_key: str | None = None
    delay: float = 0.0
    version: str = VERSION
    requests: list[Recorded] = field(default_factory=list)
    proxied: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle ---------------------------------------------------------------------

    def start(self) -> QdrantTestServer:
        server = self

        class Handler(_Handler):
            qdrant = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        self.client.close()

    def __enter__(self) -> QdrantTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        assert self._httpd is not None
        return int(self._httpd.server_address[1])

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # test helpers ------------------------------------------------------------------

    def fail(
        self, status: int, message: str, path: str = "", times: int = 1, raw: bool = False
    ) -> None:
        self.faults.append(Fault(status, message, path, times, raw))

    def collection(
        self,
        name: str,
        size: int,
        points: list[models.PointStruct] | None = None,
        distance: models.Distance = models.Distance.COSINE,
    ) -> None:
        """Create a single-unnamed-vector collection holding `points`."""
        self.client.create_collection(name, models.VectorParams(size=size, distance=distance))
        if points:
            self.client.upsert(name, points)

    # dispatch ----------------------------------------------------------------------

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """(status, JSON-able body) for one request, as real Qdrant would answer it."""
        with self._lock:
            for fault in self.faults:
                if fault.path in path and fault.times > 0:
                    fault.times -= 1
                    raise QdrantError(fault.status, fault.message, fault.raw)
            if method == "GET" and path == "/":
                return 200, {"title": "qdrant - vector search engine", "version": self.version}
            if method == "GET" and path == "/collections":
                names = [c.name for c in self.client.get_collections().collections]
                return 200, {"collections": [{"name": n} for n in names]}
            match = re.fullmatch(r"/collections/([^/]+)(/points(?:/(\w+))?)?", path)
            if match is None:
                raise QdrantError(404, "")
            name = unquote(match[1])
            if not self.client.collection_exists(name):
                raise QdrantError(404, f"Not found: Collection `{name}` doesn't exist!")
            route = (method, match[2] and (match[3] or "retrieve"))
            handler = _ROUTES.get(route)
            if handler is None:
                raise QdrantError(404, "")
            try:
                return 200, handler(self.client, name, body or {})
            except ValidationError as error:
                raise QdrantError(400, f"Format error in JSON body: {error}") from None
            except (ValueError, AssertionError) as error:
                raise QdrantError(400, f"Wrong input: {error}") from None


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json", exclude_none=True)


def _collection_info(client: QdrantClient, name: str, body: Any) -> Any:
    return _dump(client.get_collection(name))


def _query(client: QdrantClient, name: str, body: Any) -> Any:
    request = models.QueryRequest.model_validate(body)
    response = client.query_points(
        name,
        query=request.query,
        using=request.using,
        query_filter=request.filter,
        limit=request.limit or 10,
        offset=request.offset,
        score_threshold=request.score_threshold,
        with_payload=request.with_payload if request.with_payload is not None else False,
        with_vectors=request.with_vector if request.with_vector is not None else False,
    )
    return {"points": [_dump(point) for point in response.points]}


def _scroll(client: QdrantClient, name: str, body: Any) -> Any:
    request = models.ScrollRequest.model_validate(body)
    records, next_offset = client.scroll(
        name,
        scroll_filter=request.filter,
        limit=request.limit or 10,
        offset=request.offset,
        with_payload=request.with_payload if request.with_payload is not None else True,
        with_vectors=request.with_vector if request.with_vector is not None else False,
    )
    return {"points": [_dump(record) for record in records], "next_page_offset": next_offset}


def _retrieve(client: QdrantClient, name: str, body: Any) -> Any:
    request = models.PointRequest.model_validate(body)
    records = client.retrieve(
        name,
        ids=request.ids,
        with_payload=request.with_payload if request.with_payload is not None else True,
        with_vectors=request.with_vector if request.with_vector is not None else False,
    )
    return [_dump(record) for record in records]


def _count(client: QdrantClient, name: str, body: Any) -> Any:
    request = models.CountRequest.model_validate(body)
    exact = request.exact if request.exact is not None else True
    return _dump(client.count(name, count_filter=request.filter, exact=exact))


_ROUTES = {
    ("GET", None): _collection_info,
    ("POST", "query"): _query,
    ("POST", "scroll"): _scroll,
    ("POST", "retrieve"): _retrieve,
    ("POST", "count"): _count,
}


class _Handler(BaseHTTPRequestHandler):
    qdrant: QdrantTestServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        started = time.perf_counter()
        path = self.path
        if path.startswith(("http://", "https://")):  # a forward-proxy request
            self.qdrant.proxied.append(path)
            path = urlsplit(path).path or "/"
        path = path.split("?", 1)[0]
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {key.lower(): value for key, value in self.headers.items()}
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        self.qdrant.requests.append(Recorded(method, path, headers, body))
        if self.qdrant.delay:
            time.sleep(self.qdrant.delay)
        key = self.qdrant.api_key
        if key is not None and headers.get("api-key") != key:
            message = (
                "Invalid api-key"
                if "api-key" in headers
                else ("Must provide an API key or an Authorization bearer token")
            )
            self._send(401, message.encode(), "text/plain")
            return
        try:
            status, result = self.qdrant.handle(method, path, body)
        except QdrantError as error:
            if error.raw:
                self._send(error.status, str(error).encode(), "text/html")
                return
            payload: Any = {
                "status": {"error": str(error)},
                "time": time.perf_counter() - started,
            }
            self._send(error.status, json.dumps(payload).encode() if str(error) else b"")
            return
        if path == "/":
            self._send(status, json.dumps(result).encode())
            return
        envelope = {"result": result, "status": "ok", "time": time.perf_counter() - started}
        self._send(status, json.dumps(envelope).encode())

    def _send(self, status: int, data: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
