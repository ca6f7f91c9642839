"""`embeddings.query_model`: queries embedded by another model of the store's dimension."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from pydantic_ai.embeddings import EmbeddingModel, EmbeddingResult, EmbeddingSettings
from pydantic_ai.embeddings.result import EmbedInputType

import haiku.rag.embeddings as embeddings_module
from haiku.rag.client import HaikuRAG
from haiku.rag.config import config_from_dict
from haiku.rag.embeddings import HashEmbeddingModel, resolve_query_model
from haiku.rag.errors import EmbeddingError


class FixedModel(EmbeddingModel):
    """A provider model whose size is unknown until called and ignores `dimensions`."""

    def __init__(self, name: str, dimension: int) -> None:
        super().__init__()
        self._name = name
        self.dimension = dimension
        self.calls: list[tuple[list[str], EmbedInputType]] = []

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def system(self) -> str:
        return "fixed"

    async def embed(
        self,
        inputs: str | Sequence[str],
        *,
        input_type: EmbedInputType,
        settings: EmbeddingSettings | None = None,
    ) -> EmbeddingResult:
        texts, _ = self.prepare_embed(inputs, settings)
        self.calls.append((list(texts), input_type))
        return EmbeddingResult(
            embeddings=[[1.0] + [0.5] * (self.dimension - 1) for _ in texts],
            inputs=texts,
            input_type=input_type,
            model_name=self._name,
            provider_name="fixed",
        )


@pytest.fixture
def fixed_models(monkeypatch: pytest.MonkeyPatch) -> dict[str, FixedModel]:
    """`fixed:NAME-DIM` resolves to a FixedModel (one instance per name)."""
    made: dict[str, FixedModel] = {}
    real = embeddings_module.infer_embedding_model

    def infer(name: str) -> EmbeddingModel:
        if not name.startswith("fixed:"):
            return real(name)
        model = name.split(":", 1)[1]
        return made.setdefault(model, FixedModel(model, int(model.rsplit("-", 1)[1])))

    monkeypatch.setattr(embeddings_module, "infer_embedding_model", infer)
    return made


def cfg(tmp_path: Path, **embeddings: object):
    return config_from_dict(
        {
            "embeddings": {"model": "hash:v1", "dimension": 64, **embeddings},
            "storage": {"data_dir": str(tmp_path / "data")},
        }
    )


async def build(db: Path, tmp_path: Path) -> None:
    async with HaikuRAG(db, cfg(tmp_path), create=True) as kb:
        await kb.add_text("Tantivy ranks documents with BM25.", uri="mem:tantivy")
        await kb.add_text("Sourdough bread needs a lively starter.", uri="mem:bread")


async def test_queries_use_the_query_model(tmp_path: Path):
    db = tmp_path / "kb.lancedb"
    await build(db, tmp_path)
    config = config_from_dict({"embeddings": {"query_model": "hash:v1x"}})
    async with HaikuRAG(db, config, read_only=True) as kb:
        embedder = kb.embedder
        assert embedder.model_name == "hash:v1" and embedder.query_model_name == "hash:v1x"
        query = await embedder.embed_query("bread starter")
        expected = HashEmbeddingModel("v1x", dimension=64).encode(["bread starter"])[0]
        assert np.allclose(query, expected)  # the query model, at the store's dimension
        documents = await embedder.embed_documents(["bread starter"])
        assert not np.allclose(documents[0], expected)  # documents keep the store's model
        results = await kb.search("lively sourdough starter", top_k=2)
        assert results and {r.document_uri for r in results} <= {"mem:tantivy", "mem:bread"}
        assert (await kb.info()).extra["query_model"] == "hash:v1x"

    same = config_from_dict({"embeddings": {"query_model": "hash:v1"}})
    async with HaikuRAG(db, same, read_only=True) as kb:
        assert kb.embedder.query_model is None and "query_model" not in (await kb.info()).extra


async def test_a_query_model_of_another_known_size_fails_at_open(tmp_path: Path):
    pytest.importorskip("onnxruntime")  # only resolves the model: nothing is loaded
    db = tmp_path / "kb.lancedb"
    await build(db, tmp_path)
    config = config_from_dict({"embeddings": {"query_model": "local:all-MiniLM-L6-v2"}})
    kb = HaikuRAG(db, config, read_only=True)
    with pytest.raises(EmbeddingError) as caught:
        await kb.open()
    message = str(caught.value)
    assert "'local:all-MiniLM-L6-v2' makes 384-dimensional vectors" in message
    assert "'hash:v1' (64 dimensions)" in message and "remove embeddings.query_model" in message
    assert kb._store is None  # nothing left open

    # creating a store with a mismatched query model fails before anything is written
    fresh = tmp_path / "fresh.lancedb"
    with pytest.raises(EmbeddingError, match="384-dimensional"):
        await HaikuRAG(
            fresh, cfg(tmp_path, query_model="local:all-MiniLM-L6-v2"), create=True
        ).open()
    assert not fresh.exists()


async def test_a_query_model_of_unknown_size_fails_at_the_first_query(
    tmp_path: Path, fixed_models: dict[str, FixedModel]
):
    db = tmp_path / "kb.lancedb"
    await build(db, tmp_path)
    config = config_from_dict({"embeddings": {"query_model": "fixed:small-8"}})
    async with HaikuRAG(db, config, read_only=True) as kb:  # the size is not known yet
        with pytest.raises(EmbeddingError) as caught:
            await kb.search("anything")
    message = str(caught.value)
    assert "'fixed:small-8' returns 8-dimensional vectors but 'hash:v1' stores 64" in message

    good = config_from_dict({"embeddings": {"query_model": "fixed:wide-64"}})
    async with HaikuRAG(db, good, read_only=True) as kb:
        assert len(await kb.search("anything", top_k=1)) == 1
    assert fixed_models["wide-64"].calls == [(["anything"], "query")]


def test_resolve_query_model_errors():
    assert isinstance(resolve_query_model("hash:q", "hash:v1", 32), HashEmbeddingModel)
    assert resolve_query_model("hash:q", "hash:v1", None).dimension == 384  # type: ignore[attr-defined]
    with pytest.raises(EmbeddingError, match="needs a provider prefix"):
        resolve_query_model("nonsense", "hash:v1", 32)
    with pytest.raises(EmbeddingError, match="Unknown local embedding model"):
        resolve_query_model("local:other", "hash:v1", None)
