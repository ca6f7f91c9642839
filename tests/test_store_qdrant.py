"""The qdrant attach driver (read-only subset of the conformance suite).

Runs against tests/qdrant_server.py: a loopback server speaking Qdrant's REST API,
backed by qdrant-client's local mode. No test leaves 127.0.0.1.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from qdrant_client import models
from qdrant_server import QdrantTestServer

from haiku.rag.documents import Chunk, Document, document_id_for
from haiku.rag.errors import ReadOnlyError, StoreError, StoreNotFoundError
from haiku.rag.store import driver_class, infer_driver
from haiku.rag.store import qdrant as qd
from haiku.rag.store.base import Store
from haiku.rag.store.qdrant import (
    AttachFile,
    Endpoint,
    QdrantStore,
    attach,
    attach_command,
    bypass_proxy,
    parse_url,
    point_id,
    split_host,
)

KEY_ENV = "HAIKU_TEST_QDRANT_KEY"
SECRET = "s3cr3t-key-value-0123456789"

# (id, text, metadata, vector): two chunks of one document, ordered by start_index
# against their id order, a titled document, and a point with no source at all.
POINTS = [
    (
        1,
        "It supports native full-text search.",
        {"source": "docs/lancedb.md", "start_index": 40},
        [0.9, 0.1, 0.0, 0.0],
    ),
    (
        2,
        "LanceDB is an embedded vector database.",
        {"source": "docs/lancedb.md", "start_index": 0},
        [1.0, 0.0, 0.0, 0.0],
    ),
    (3, "Tantivy ranks documents with BM25.", {"source": "docs/tantivy.md"}, [0.0, 1.0, 0.0, 0.0]),
    (
        4,
        "Boil salted water for the pasta.",
        {"source": "cooking/pasta.md", "title": "Pasta"},
        [0.0, 0.0, 1.0, 0.0],
    ),
    (5, "A note that has no source.", None, [0.0, 0.0, 0.0, 1.0]),
]


def uid(number: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"point-{number}"))


def make_points(ids: str = "int") -> list[models.PointStruct]:
    points = []
    for number, text, metadata, vector in POINTS:
        payload: dict = {"page_content": text}
        if metadata is not None:
            payload["metadata"] = metadata
        pid = number if ids == "int" else uid(number)
        points.append(models.PointStruct(id=pid, vector=vector, payload=payload))
    return points


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def server() -> Iterator[QdrantTestServer]:
    with QdrantTestServer() as running:
        running.collection("docs", 4, make_points("int"))
        running.collection("uuids", 4, make_points("uuid"))
        yield running


def attach_docs(
    server: QdrantTestServer, tmp_path: Path, collection: str = "docs", **kwargs
) -> qd.AttachReport:
    kwargs.setdefault("embedding_model", "hash:v1")
    return attach(tmp_path / f"{collection}.qdrant.yaml", server.address, collection, **kwargs)


@pytest.fixture
def store(server: QdrantTestServer, tmp_path: Path) -> Iterator[QdrantStore]:
    report = attach_docs(server, tmp_path)
    opened = QdrantStore.open(str(report.path))
    yield opened
    opened.close()


def q(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- pure helpers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("localhost", True),
        ("LOCALHOST.", True),
        ("db.localhost", True),
        ("qdrant.local", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("10.1.2.3", True),
        ("172.16.0.1", True),
        ("172.31.255.255", True),
        ("172.32.0.1", False),
        ("192.168.1.20", True),
        ("169.254.1.1", True),
        ("::1", True),
        ("[::1]", True),
        ("fd12:3456::1", True),
        ("fe80::1%eth0", True),
        ("::ffff:10.0.0.1", True),
        ("8.8.8.8", False),
        ("2001:4860::8888", False),
        ("qdrant.example.com", False),
        ("local.example.com", False),
        ("xyz.cloud.qdrant.io", False),
    ],
)
def test_bypass_proxy(host: str, expected: bool) -> None:
    assert bypass_proxy(host) is expected


@pytest.mark.parametrize(
    ("path", "driver"),
    [
        ("kb.qdrant.yaml", "qdrant"),
        ("dir/KB.QDRANT.YML", "qdrant"),
        ("qdrant://localhost:6333/docs", "qdrant"),
        (Path("qdrant://localhost:6333/docs"), "qdrant"),  # pathlib collapses // to /
        ("https://xyz.cloud.qdrant.io:6333/docs", "qdrant"),
        ("kb.lancedb", "lancedb"),
        ("qdrant.lancedb", "lancedb"),
    ],
)
def test_infer_driver(path: str | Path, driver: str) -> None:
    assert infer_driver(path) == driver


def test_driver_is_registered_and_satisfies_the_protocol(store: QdrantStore) -> None:
    assert driver_class("qdrant") is QdrantStore
    assert isinstance(store, Store)


def test_attach_path() -> None:
    assert qd.attach_path("kb") == Path("kb.qdrant.yaml")
    assert qd.attach_path("dir/kb.qdrant.yaml") == Path("dir/kb.qdrant.yaml")
    assert qd.attach_path("kb.v2") == Path("kb.v2.qdrant.yaml")


@pytest.mark.parametrize(
    ("text", "port", "https", "expected"),
    [
        ("localhost", None, False, ("localhost", 6333, False)),
        ("localhost:6334", None, False, ("localhost", 6334, False)),
        ("localhost", 7000, False, ("localhost", 7000, False)),
        ("https://q.example.com", None, False, ("q.example.com", 6333, True)),
        ("http://q.example.com:80/", None, True, ("q.example.com", 80, True)),
        ("[::1]:6333", None, False, ("::1", 6333, False)),
    ],
)
def test_split_host(text: str, port: int | None, https: bool, expected: tuple) -> None:
    assert split_host(text, port, https) == expected


@pytest.mark.parametrize(
    ("text", "port", "message"),
    [
        ("", None, "No Qdrant host"),
        ("ftp://h", None, "use http:// or https://"),
        ("h:1", 2, "names port 1 but port=2"),
        ("h/x", None, "expected HOST or HOST:PORT"),
        ("h:99999", None, "Invalid Qdrant host"),
    ],
)
def test_split_host_errors(text: str, port: int | None, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        split_host(text, port)


def test_endpoint_formats_ipv6() -> None:
    endpoint = Endpoint("::1", 6333, True, "my docs")
    assert endpoint.base_url == "https://[::1]:6333"
    assert endpoint.label == "[::1]:6333"
    assert endpoint.url == "https://[::1]:6333/my%20docs"


def test_parse_url() -> None:
    assert parse_url("qdrant://h:1/docs") == Endpoint("h", 1, False, "docs")
    assert parse_url("qdrant:/h/docs") == Endpoint("h", 6333, False, "docs")
    endpoint = parse_url("https://h/docs?api_key_env=KEY&timeout=2.5")
    assert endpoint == Endpoint("h", 6333, True, "docs", "KEY", 2.5)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("qdrant://h:1", "expected qdrant://host:port/collection"),
        ("qdrant://h:1/a/b", "expected qdrant://host:port/collection"),
        ("qdrant://h/docs?key=x", "unknown parameter"),
        ("qdrant://h/docs?timeout=soon", "timeout must be seconds"),
        ("qdrant://h/docs?api_key_env=abc-def-123-456", "not the key itself"),
        ("qdrant://h/docs?api_key_env=1X", "not '1X'"),
    ],
)
def test_parse_url_errors(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        parse_url(url)


@pytest.mark.parametrize(
    ("chunk_id", "expected"),
    [
        ("42", 42),
        ("0", 0),
        ("042", None),
        (str(2**64), None),
        (uid(1), uid(1)),
        (uid(1).upper(), None),
        (uid(1).replace("-", ""), None),
        ("0123456789abcdef", None),
        ("٣", None),
    ],
)
def test_point_id_round_trip(chunk_id: str, expected: object) -> None:
    assert point_id(chunk_id) == expected


# --- attach ----------------------------------------------------------------------------


def test_attach_int_ids(server: QdrantTestServer, tmp_path: Path) -> None:
    report = attach_docs(server, tmp_path)
    assert (report.dimension, report.points, report.id_kind) == (4, 5, "integer")
    assert report.distance == "Cosine" and report.server_version == "1.15.1"
    assert report.keyword_search and report.warnings == []
    assert report.url == f"http://{server.address}/docs"
    assert any("4-dimensional" in line for line in report.lines())
    record = AttachFile.read(report.path)
    assert (record.host, record.port, record.collection) == ("127.0.0.1", server.port, "docs")
    assert record.settings.embedding_model == "hash:v1"
    assert record.settings.embedding_dim == 4
    assert (record.settings.chunk_size, record.settings.chunk_overlap) == (0, 0)
    assert record.settings.driver == "qdrant"


def test_attach_uuid_ids(server: QdrantTestServer, tmp_path: Path) -> None:
    report = attach_docs(server, tmp_path, "uuids")
    assert report.id_kind == "UUID"
    QdrantStore.open(str(report.path)).close()


def test_attach_file_names_the_env_var_never_the_key(
    server: QdrantTestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.api_key = SECRET
    monkeypatch.setenv(KEY_ENV, SECRET)
    report = attach_docs(server, tmp_path, api_key_env=KEY_ENV)
    text = report.path.read_text()
    assert f"api_key_env: {KEY_ENV}" in text
    assert SECRET not in text
    store = QdrantStore.open(str(report.path))
    store.vector_search(q(1, 0, 0, 0), 2)
    assert server.requests and all(r.headers.get("api-key") == SECRET for r in server.requests)
    server.api_key = "rotated-key"  # read at request time: rotation needs no reopen
    monkeypatch.setenv(KEY_ENV, "rotated-key")
    assert store.count_chunks() == 5
    assert server.requests[-1].headers["api-key"] == "rotated-key"
    store.close()


def test_attach_without_required_key_says_so(server: QdrantTestServer, tmp_path: Path) -> None:
    server.api_key = SECRET
    with pytest.raises(StoreError, match=r"answered 401 .*wants an API key"):
        attach_docs(server, tmp_path)


def test_wrong_key_is_reported(
    server: QdrantTestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.api_key = SECRET
    monkeypatch.setenv(KEY_ENV, "wrong")
    with pytest.raises(StoreError, match=rf"Invalid api-key \(the API key in \${KEY_ENV}"):
        attach_docs(server, tmp_path, api_key_env=KEY_ENV)


def test_missing_env_var_is_a_clear_error(
    server: QdrantTestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(StoreError, match=f"environment variable {KEY_ENV} is not set"):
        attach_docs(server, tmp_path, api_key_env=KEY_ENV)
    monkeypatch.setenv(KEY_ENV, SECRET)
    report = attach_docs(server, tmp_path, api_key_env=KEY_ENV)
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(StoreError, match=f"{KEY_ENV} is not set.*127.0.0.1:{server.port}"):
        QdrantStore.open(str(report.path))


def test_key_itself_is_refused_as_env_name(server: QdrantTestServer, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="not the key itself"):
        attach_docs(server, tmp_path, api_key_env=SECRET)
    assert not (tmp_path / "docs.qdrant.yaml").exists()


def test_key_over_plain_http_to_remote_host_warns(
    server: QdrantTestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", f"http://{server.address}")
    monkeypatch.setenv(KEY_ENV, SECRET)
    report = attach(
        tmp_path / "remote.qdrant.yaml",
        "qdrant.example.com:6333",
        "docs",
        embedding_model="hash:v1",
        api_key_env=KEY_ENV,
    )
    assert any("plain http" in warning for warning in report.warnings)


def test_attach_no_server_names_host(tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(StoreError, match=f"Cannot reach Qdrant at 127.0.0.1:{port}"):
        attach(tmp_path / "x.qdrant.yaml", f"127.0.0.1:{port}", "docs", embedding_model="hash:v1")
    assert not (tmp_path / "x.qdrant.yaml").exists()


def test_attach_missing_collection_lists_the_others(
    server: QdrantTestServer, tmp_path: Path
) -> None:
    with pytest.raises(StoreError, match=r"no collection 'nope' \(collections there: docs, uuids"):
        attach_docs(server, tmp_path, "nope")


def test_attach_rejects_named_vectors(server: QdrantTestServer, tmp_path: Path) -> None:
    server.client.create_collection(
        "named",
        {
            "dense": models.VectorParams(size=4, distance=models.Distance.COSINE),
            "title": models.VectorParams(size=4, distance=models.Distance.COSINE),
        },
    )
    with pytest.raises(StoreError, match=r"named vectors \(dense, title\)"):
        attach_docs(server, tmp_path, "named")


def test_attach_rejects_multivector(server: QdrantTestServer, tmp_path: Path) -> None:
    server.client.create_collection(
        "colbert",
        models.VectorParams(
            size=4,
            distance=models.Distance.COSINE,
            multivector_config=models.MultiVectorConfig(
                comparator=models.MultiVectorComparator.MAX_SIM
            ),
        ),
    )
    with pytest.raises(StoreError, match="multi-vector collection"):
        attach_docs(server, tmp_path, "colbert")


def test_attach_rejects_sparse_only(server: QdrantTestServer, tmp_path: Path) -> None:
    server.client.create_collection(
        "sparse", {}, sparse_vectors_config={"bm25": models.SparseVectorParams()}
    )
    with pytest.raises(StoreError, match="has no dense vector"):
        attach_docs(server, tmp_path, "sparse")


def test_attach_rejects_manhattan(server: QdrantTestServer, tmp_path: Path) -> None:
    server.collection("manhattan", 4, distance=models.Distance.MANHATTAN)
    with pytest.raises(StoreError, match="Manhattan distance"):
        attach_docs(server, tmp_path, "manhattan")


def test_attach_rejects_points_without_page_content(
    server: QdrantTestServer, tmp_path: Path
) -> None:
    server.collection(
        "llamaindex",
        4,
        [models.PointStruct(id=7, vector=[1, 0, 0, 0], payload={"text": "x", "doc_id": "a"})],
    )
    with pytest.raises(StoreError, match=r"Point 7 .* payload keys: doc_id, text"):
        attach_docs(server, tmp_path, "llamaindex")


def test_attach_empty_collection_warns(server: QdrantTestServer, tmp_path: Path) -> None:
    server.collection("empty", 8)
    report = attach_docs(server, tmp_path, "empty")
    assert (report.points, report.dimension, report.id_kind) == (0, 8, "none")
    assert any("is empty" in warning for warning in report.warnings)
    QdrantStore.open(str(report.path)).close()


def test_attach_refuses_old_servers(server: QdrantTestServer, tmp_path: Path) -> None:
    server.version = "1.9.4"
    with pytest.raises(StoreError, match=r"runs version 1.9.4.*1.10 or later"):
        attach_docs(server, tmp_path)


def test_attach_checks_its_arguments(server: QdrantTestServer, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"end in \.qdrant\.yaml.*kb\.yaml\.qdrant\.yaml"):
        attach(tmp_path / "kb.yaml", server.address, "docs", embedding_model="hash:v1")
    with pytest.raises(StoreError, match="needs a provider prefix"):
        attach_docs(server, tmp_path, embedding_model="all-MiniLM-L6-v2")
    attach_docs(server, tmp_path)
    with pytest.raises(StoreError, match="already exists"):
        attach_docs(server, tmp_path)
    attach_docs(server, tmp_path, overwrite=True)


def test_dot_and_euclid_distances(server: QdrantTestServer, tmp_path: Path) -> None:
    for name, distance in (("dot", models.Distance.DOT), ("euclid", models.Distance.EUCLID)):
        points = [
            models.PointStruct(id=p.id, vector=list(q(*p.vector)), payload=p.payload)
            for p in make_points()
        ]
        server.collection(name, 4, points, distance=distance)
        report = attach_docs(server, tmp_path, name)
        assert any("L2-normalised" in warning for warning in report.warnings)
        store = QdrantStore.open(str(report.path))
        hits = store.vector_search(q(1, 0, 0, 0), 3)
        store.close()
        assert [cid for cid, _ in hits[:2]] == ["2", "1"]  # then a tie of orthogonal points
        assert hits[0][1] == pytest.approx(1.0, abs=1e-5)
        assert hits[1][1] == pytest.approx(float(q(0.9, 0.1, 0, 0)[0]), abs=1e-5)
        assert hits[2][1] == pytest.approx(0.0, abs=1e-5)


# --- reading ---------------------------------------------------------------------------


def test_store_basics(store: QdrantStore) -> None:
    assert store.driver == "qdrant" and store.read_only
    assert store.features == qd.StoreFeatures(writable=False, keyword_search=True, graph=False)
    assert store.settings.embedding_dim == 4
    assert store.load_graph() is None


def test_vector_search_ranks_by_cosine(store: QdrantStore) -> None:
    hits = store.vector_search(q(1, 0.05, 0, 0), 3)
    assert [cid for cid, _ in hits] == ["2", "1", "3"]
    scores = [score for _, score in hits]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] == pytest.approx(float(q(1, 0.05, 0, 0)[0]), abs=1e-5)
    assert store.vector_search(q(1, 0, 0, 0), 0) == []


def test_vector_search_filters_by_document(store: QdrantStore, server: QdrantTestServer) -> None:
    tantivy_doc = document_id_for("docs/tantivy.md")
    no_source_doc = document_id_for("5")
    hits = store.vector_search(q(1, 0, 0, 0), 5, document_ids={tantivy_doc, no_source_doc})
    assert sorted(cid for cid, _ in hits) == ["3", "5"]
    hits = store.vector_search(q(0, 0, 1, 0), 5, document_ids=[document_id_for("docs/lancedb.md")])
    assert sorted(cid for cid, _ in hits) == ["1", "2"]
    before = len(server.requests)
    assert store.vector_search(q(1, 0, 0, 0), 5, document_ids=["unknown"]) == []
    assert len(server.requests) == before  # nothing to ask Qdrant


def test_vector_search_checks_dimension(store: QdrantStore) -> None:
    with pytest.raises(StoreError, match=r"has 3 dimensions but .* holds 4"):
        store.vector_search(q(1, 0, 0), 3)


def test_uuid_ids_round_trip(server: QdrantTestServer, tmp_path: Path) -> None:
    store = QdrantStore.open(str(attach_docs(server, tmp_path, "uuids").path))
    hits = store.vector_search(q(1, 0, 0, 0), 2)
    assert [cid for cid, _ in hits] == [uid(2), uid(1)]
    chunks = store.get_chunks([uid(1), "not-a-point", uid(2)])
    assert [c.id for c in chunks] == [uid(1), uid(2)]
    assert [c.order for c in chunks] == [1, 0]
    assert store.document_chunks(document_id_for(uid(5)))[0].content.startswith("A note")
    store.close()


def test_get_chunks(store: QdrantStore) -> None:
    chunks = store.get_chunks(["3", "nope", "2", "99", "1", "042", "3"])
    assert [c.id for c in chunks] == ["3", "2", "1", "3"]
    lancedb = document_id_for("docs/lancedb.md")
    assert chunks[1] == Chunk(id="2", document_id=lancedb, order=0, content=POINTS[1][1], start=0)
    assert (chunks[2].order, chunks[2].start) == (1, 40)
    assert chunks[0].document_id == document_id_for("docs/tantivy.md")


def test_get_chunks_fetches_points_added_after_the_catalogue(
    store: QdrantStore, server: QdrantTestServer
) -> None:
    assert store.count_documents() == 4  # the catalogue is now a snapshot
    server.client.upsert(
        "docs",
        [models.PointStruct(id=6, vector=[1, 1, 0, 0], payload={"page_content": "new"})],
    )
    assert [c.content for c in store.get_chunks(["6", "3"])] == ["new", POINTS[2][1]]


def test_counts(store: QdrantStore) -> None:
    assert store.count_chunks() == 5
    assert store.count_documents() == 4


def test_list_documents(store: QdrantStore) -> None:
    documents = store.list_documents()
    assert [d.uri for d in documents] == [
        "5",
        "cooking/pasta.md",
        "docs/lancedb.md",
        "docs/tantivy.md",
    ]
    lancedb = documents[2]
    assert lancedb.id == document_id_for("docs/lancedb.md")
    assert lancedb.content == f"{POINTS[1][1]}\n\n{POINTS[0][1]}"
    assert documents[1].title == "Pasta"
    assert documents[0].metadata == {}
    assert [d.uri for d in store.list_documents(limit=2, offset=1)] == [
        "cooking/pasta.md",
        "docs/lancedb.md",
    ]
    assert store.list_documents(offset=10) == []


def test_get_document_and_hashes(store: QdrantStore) -> None:
    document = store.get_document(document_id_for("cooking/pasta.md"))
    assert isinstance(document, Document) and document.content == POINTS[3][1]
    assert store.get_document("missing") is None
    assert [d.id for d in store.get_documents(["missing", document.id])] == [document.id]
    assert store.document_chunks("missing") == []
    assert [c.id for c in store.document_chunks(document_id_for("docs/lancedb.md"))] == ["2", "1"]
    hashes = store.document_hashes()
    assert hashes["cooking/pasta.md"] == document.content_hash
    assert len(hashes) == 4


def test_catalogue_pages_through_the_collection(
    store: QdrantStore, server: QdrantTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(qd, "SCROLL_PAGE", 2)
    assert store.count_documents() == 4
    scrolls = [r for r in server.requests if r.path.endswith("/points/scroll")]
    assert [r.body.get("offset") for r in scrolls[-3:]] == [None, 3, 5]
    assert all(r.body["with_vector"] is False for r in scrolls)
    store.count_documents()
    assert len([r for r in server.requests if r.path.endswith("/scroll")]) == len(scrolls)


def test_keyword_search(store: QdrantStore) -> None:
    hits = store.keyword_search("BM25 ranking", 5)
    assert [cid for cid, _ in hits] == ["3"] and hits[0][1] > 0
    both = store.keyword_search("searching databases", 5)  # stemmed: search, databas
    assert {cid for cid, _ in both} == {"1", "2"}
    only = store.keyword_search("database pasta", 5, [document_id_for("cooking/pasta.md")])
    assert [cid for cid, _ in only] == ["4"]
    assert store.keyword_search("   ", 5) == []
    assert store.keyword_search("pasta", 0) == []
    # Query syntax is just characters, never an error.
    assert [cid for cid, _ in store.keyword_search('pasta AND (content:"', 5)] == ["4"]


def test_writes_are_refused(store: QdrantStore, tmp_path: Path) -> None:
    document = Document.from_text("x", uri="x.md")
    for attempt in (
        lambda: store.write([document], [], np.zeros((0, 4), dtype=np.float32)),
        lambda: store.delete_documents([document.id]),
        lambda: store.save_graph({}),
        lambda: QdrantStore.create(str(tmp_path / "new.qdrant.yaml"), store.settings),
    ):
        with pytest.raises(ReadOnlyError, match="an attached Qdrant collection is read-only"):
            attempt()
    assert store.count_chunks() == 5


# --- failures --------------------------------------------------------------------------


def test_http_500_names_host_status_and_message(
    store: QdrantStore, server: QdrantTestServer
) -> None:
    server.fail(500, "Service internal error: disk on fire", "/points/query")
    with pytest.raises(StoreError) as caught:
        store.vector_search(q(1, 0, 0, 0), 3)
    message = str(caught.value)
    assert f"127.0.0.1:{server.port}" in message
    assert "answered 500" in message and "disk on fire" in message
    assert store.vector_search(q(1, 0, 0, 0), 1)[0][0] == "2"  # recovers


def test_non_json_and_envelope_errors(store: QdrantStore, server: QdrantTestServer) -> None:
    server.fail(502, "", "/points/count")
    with pytest.raises(StoreError, match=r"answered 502 .*Bad Gateway"):
        store.count_chunks()
    server.fail(200, "not an envelope", "/points/count")
    with pytest.raises(StoreError, match="without a `result`"):
        store.count_chunks()
    server.fail(503, '{"status": "down"}', "/points/count", raw=True)
    with pytest.raises(StoreError, match=r"answered 503 .*down"):
        store.count_chunks()
    server.fail(200, "<html>", "/points/count", raw=True)
    with pytest.raises(StoreError, match=r"not JSON .*is it a Qdrant server"):
        store.count_chunks()


def test_timeout_names_host(server: QdrantTestServer, tmp_path: Path) -> None:
    report = attach_docs(server, tmp_path, timeout=0.3)
    store = QdrantStore.open(str(report.path))
    server.delay = 1.0
    with pytest.raises(StoreError, match=f"127.0.0.1:{server.port} did not answer .* 0.3s"):
        store.count_chunks()
    store.close()


def test_open_failures(server: QdrantTestServer, tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match="No Qdrant attach file"):
        QdrantStore.open(str(tmp_path / "missing.qdrant.yaml"))
    bad = tmp_path / "bad.qdrant.yaml"
    bad.write_text("host: h\n")
    with pytest.raises(StoreError, match="not a valid Qdrant attach file"):
        QdrantStore.open(str(bad))
    folder = tmp_path / "folder.qdrant.yaml"
    folder.mkdir()
    with pytest.raises(StoreError, match="Cannot read attach file"):
        QdrantStore.open(str(folder))
    report = attach_docs(server, tmp_path)
    with pytest.raises(StoreError, match="attached with embedding model 'hash:v1'"):
        QdrantStore.open(str(report.path), embedding_model="local:all-MiniLM-L6-v2")
    server.client.delete_collection("docs")
    with pytest.raises(StoreError, match="no collection 'docs'"):
        QdrantStore.open(str(report.path))
    server.collection("docs", 8)
    with pytest.raises(StoreError, match=r"now holds 8-dimensional vectors.*attached at 4"):
        QdrantStore.open(str(report.path))


def test_qdrant_url_form(server: QdrantTestServer) -> None:
    url = f"qdrant://{server.address}/docs"
    with pytest.raises(StoreError, match="does not say which embedding model"):
        QdrantStore.open(url)
    store = QdrantStore.open(url, embedding_model="hash:v1")
    assert store.settings.embedding_dim == 4 and store.settings.embedding_model == "hash:v1"
    assert store.vector_search(q(0, 1, 0, 0), 1)[0][0] == "3"
    assert store.count_documents() == 4
    store.close()
    collapsed = str(Path(f"qdrant://{server.address}/uuids"))
    assert collapsed.startswith("qdrant:/1")
    store = QdrantStore.open(collapsed, embedding_model="hash:v1")
    assert store.count_chunks() == 5
    store.close()


def test_remote_hosts_honour_the_proxy(
    server: QdrantTestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", f"http://{server.address}")
    report = attach(
        tmp_path / "remote.qdrant.yaml", "qdrant.example.com", "docs", embedding_model="hash:v1"
    )
    assert report.points == 5
    assert "http://qdrant.example.com:6333/collections/docs" in server.proxied


def test_loopback_bypasses_the_proxy(
    server: QdrantTestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, dead)
    assert attach_docs(server, tmp_path).points == 5
    assert server.proxied == []


# --- collections larger than the catalogue ---------------------------------------------


def test_large_collection_keeps_vector_search(server: QdrantTestServer, tmp_path: Path) -> None:
    report = attach_docs(server, tmp_path, catalogue_limit=3)
    assert not report.keyword_search
    assert any("no bm25" in line for line in report.lines())
    store = QdrantStore.open(str(report.path))
    assert not store.features.keyword_search
    for call in (
        store.list_documents,
        store.count_documents,
        store.document_hashes,
        lambda: store.keyword_search("pasta", 3),
    ):
        with pytest.raises(StoreError, match="more than the catalogue_limit of 3"):
            call()
    lancedb = document_id_for("docs/lancedb.md")
    assert store.get_document(lancedb) is None  # not met yet: its source is unknown
    with pytest.raises(StoreError, match="filter by unseen document"):
        store.vector_search(q(1, 0, 0, 0), 3, [lancedb])
    hits = store.vector_search(q(1, 0, 0, 0), 5)
    chunks = store.get_chunks([cid for cid, _ in hits])
    assert [c.id for c in chunks] == [cid for cid, _ in hits]
    assert [c.id for c in chunks[:2]] == ["2", "1"] and len(chunks) == 5
    document = store.get_document(lancedb)
    assert document is not None and document.content == f"{POINTS[1][1]}\n\n{POINTS[0][1]}"
    assert [c.id for c in store.document_chunks(document_id_for("5"))] == ["5"]
    hits = store.vector_search(q(1, 0, 0, 0), 5, [lancedb, document_id_for("5")])
    assert sorted(cid for cid, _ in hits) == ["1", "2", "5"]
    server.client.delete("docs", models.PointIdsList(points=[5]))
    assert store.get_document(document_id_for("5")) is None
    store.close()


def test_collection_grown_past_the_limit(server: QdrantTestServer, tmp_path: Path) -> None:
    store = QdrantStore.open(str(attach_docs(server, tmp_path, catalogue_limit=5).path))
    assert store.features.keyword_search
    server.client.upsert(
        "docs", [models.PointStruct(id=9, vector=[1, 1, 1, 1], payload={"page_content": "z"})]
    )
    with pytest.raises(StoreError, match="catalogue_limit of 5"):
        store.count_documents()
    assert not store.features.keyword_search
    assert store.get_chunks(["9"])[0].content == "z"
    store.close()


# --- the CLI entry point and the client ------------------------------------------------


def test_attach_command(server: QdrantTestServer, config, tmp_path: Path) -> None:
    lines: list[str] = []
    name = str(tmp_path / "kb")
    report = attach_command(
        name, f"http://{server.address}", "docs", config=config, echo=lines.append
    )
    assert report.path == tmp_path / "kb.qdrant.yaml"
    assert report.embedding_model == "hash:v1"
    assert lines[0].startswith(f"Attached http://{server.address}/docs")
    assert any("dimension to 256" in line and line.startswith("warning:") for line in lines)
    data = yaml.safe_load(report.path.read_text())
    assert data["driver"] == "qdrant" and data["api_key_env"] is None
    with pytest.raises(StoreError, match="already exists"):
        attach_command(name, server.address, "docs", config=config, echo=lines.append)
    report = attach_command(
        name,
        server.address,
        "docs",
        config=config,
        embedding_model="openai:x",
        force=True,
        echo=lines.append,
    )
    assert report.embedding_model == "openai:x"


def test_attach_command_reads_the_config_by_default(
    server: QdrantTestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "haiku.rag.yaml").write_text("embeddings:\n  model: hash:v1\n  dimension: 4\n")
    monkeypatch.chdir(tmp_path)
    server.collection("empty", 4)
    lines: list[str] = []
    warnings: list[str] = []
    report = attach_command("kb", server.address, "empty", echo=lines.append, warn=warnings.append)
    assert report.embedding_model == "hash:v1"
    assert not any(line.startswith("warning:") for line in lines)
    assert len(warnings) == 1 and "is empty" in warnings[0]
    assert (tmp_path / "kb.qdrant.yaml").is_file()


async def test_haiku_rag_searches_an_attached_collection(
    server: QdrantTestServer, config, tmp_path: Path
) -> None:
    from conftest import CORPUS

    from haiku.rag.client import HaikuRAG
    from haiku.rag.embeddings import EmbeddingService

    embedder = EmbeddingService.from_config(config.embeddings)
    texts = list(CORPUS.values())
    vectors = await embedder.embed_documents(texts)
    server.collection(
        "corpus",
        vectors.shape[1],
        [
            models.PointStruct(
                id=uid(number),
                vector=vector.tolist(),
                payload={"page_content": text, "metadata": {"source": name}},
            )
            for number, (name, text, vector) in enumerate(zip(CORPUS, texts, vectors, strict=True))
        ],
    )
    report = attach_docs(server, tmp_path, "corpus")
    assert report.dimension == 256

    async with HaikuRAG(report.path, config, read_only=True) as kb:
        assert kb.driver == "qdrant"
        results = await kb.search("full-text search engine written in Rust with BM25", top_k=3)
        assert results[0].document_uri == "tantivy.md"
        assert results[0].content == CORPUS["tantivy.md"]
        assert set(results[0].signal_ranks) == {"vector", "bm25"}
        filtered = await kb.search("bread and pasta", filter="cooking/*")
        assert {r.document_uri for r in filtered} == {"cooking/pasta.md", "cooking/bread.txt"}
        info = await kb.info()
        assert (info.driver, info.documents, info.chunks) == ("qdrant", 5, 5)
        assert info.signals == ["vector", "bm25"] and info.read_only
        assert not kb.store.features.writable
        with pytest.raises(ReadOnlyError, match="qdrant driver is read-only"):
            await kb.delete_document("tantivy.md")
