"""Application settings: one pydantic model, loaded from the first config file found.

Load order: the file named by `HAIKU_RAG_CONFIG`, then `./haiku.rag.yaml`, then
`<user config dir>/haiku.rag/config.yaml`, then the built-in defaults. Unknown
keys and invalid values are rejected with the dotted key that is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import platformdirs
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from haiku.rag.errors import ConfigError

CONFIG_ENV = "HAIKU_RAG_CONFIG"
LOCAL_CONFIG_NAME = "haiku.rag.yaml"
DEFAULT_EMBEDDING_MODEL = "local:all-MiniLM-L6-v2"
DEFAULT_CHUNK_SIZE = 2000


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EmbeddingsConfig(_Section):
    model: str = Field(
        DEFAULT_EMBEDDING_MODEL,
        description="`provider:name`; `local:all-MiniLM-L6-v2` (offline), `hash:v1` "
        "(deterministic, no dependencies) or any Pydantic AI embedding model.",
    )
    dimension: int | None = Field(
        None, gt=0, description="Vector size; inferred from the model when unset."
    )
    batch_size: int = Field(32, gt=0, description="Texts sent to the embedder per call.")
    max_retries: int = Field(3, ge=0, description="Retries of a failed embedding batch.")
    query_model: str | None = Field(
        None, description="Embed queries with another model (same dimension); default: `model`."
    )

    @model_validator(mode="after")
    def _has_provider(self) -> EmbeddingsConfig:
        for key in ("model", "query_model"):
            value = getattr(self, key)
            if value is not None and ":" not in value:
                raise ValueError(
                    f"embeddings.{key} {value!r} needs a provider prefix, "
                    f"e.g. 'local:all-MiniLM-L6-v2' or 'openai:text-embedding-3-small'"
                )
        return self


class ChunkingConfig(_Section):
    size: int | None = Field(
        None,
        gt=0,
        description=f"Chunk size in characters. Unset: {DEFAULT_CHUNK_SIZE}, or less when the "
        "embedder reads a shorter window.",
    )
    overlap: int | None = Field(
        None, ge=0, description="Characters shared by neighbouring chunks; unset: 5% of size."
    )

    @model_validator(mode="after")
    def _overlap_smaller_than_size(self) -> ChunkingConfig:
        if self.size is not None and self.overlap is not None and self.overlap >= self.size:
            raise ValueError(
                f"chunking.overlap ({self.overlap}) must be smaller than "
                f"chunking.size ({self.size})"
            )
        return self


class SearchConfig(_Section):
    top_k: int = Field(5, gt=0, description="Results returned after fusion.")
    vector_weight: float = Field(1.125, ge=0, description="RRF weight of the vector signal.")
    bm25_weight: float = Field(1.0, ge=0, description="RRF weight of the BM25 signal.")
    graph_weight: float = Field(0.9, ge=0, description="RRF weight of the graph signal.")
    rrf_k: int = Field(60, gt=0, description="RRF constant: score = weight / (rrf_k + rank).")
    candidates: int = Field(
        50, gt=0, description="Candidates each signal returns before fusion or reranking."
    )
    reranker_model: str | None = Field(
        None,
        description="When set, a reranker re-scores the candidates instead of RRF (and the "
        "graph signal is not used): `cross-encoder:NAME_OR_PATH` (sentence-transformers) or "
        "any Pydantic AI chat model, e.g. `openai:gpt-5-mini`.",
    )
    rerank_candidates: int = Field(
        50, gt=0, description="Candidates each signal returns for the reranker to re-score."
    )


GRAPH_CHUNK_PLACEHOLDER = "__CHUNK__"


class GraphConfig(_Section):
    extractor_model: str | None = Field(
        None,
        description="Pydantic AI chat model that extracts entities and relationships from "
        "each new or changed chunk; unset: no knowledge graph, no graph signal, no cost.",
    )
    extractor_prompt: str | None = Field(
        None,
        description=f"Custom extraction prompt; must contain `{GRAPH_CHUNK_PLACEHOLDER}` (replaced "
        "by the chunk text) and ask for the same JSON structure (entities, relationships).",
    )
    hops: int = Field(
        1, ge=0, description="Graph hops expanded from the entities named in a query (0: none)."
    )
    max_entities: int = Field(
        20, gt=0, description="Highest-scoring entities whose chunks the graph signal returns."
    )
    concurrency: int = Field(4, gt=0, description="Chunks sent to the extractor at once.")
    max_retries: int = Field(
        2, ge=0, description="Retries of an extraction call that failed or returned invalid output."
    )

    @field_validator("extractor_prompt")
    @classmethod
    def _prompt_has_placeholder(cls, prompt: str | None) -> str | None:
        if prompt is not None and GRAPH_CHUNK_PLACEHOLDER not in prompt:
            raise ValueError(
                f"the prompt must contain {GRAPH_CHUNK_PLACEHOLDER} where the chunk text goes; "
                "add it, or remove the setting to use the default prompt"
            )
        return prompt


class QAConfig(_Section):
    model: str | None = Field(
        None, description="Pydantic AI chat model for `ask`, e.g. `openai:gpt-5`."
    )
    max_searches: int = Field(8, gt=0, description="`search` calls allowed per question.")
    max_executions: int = Field(8, gt=0, description="`execute_code` calls allowed per question.")


class SandboxConfig(_Section):
    code_timeout: float = Field(10.0, gt=0, description="Seconds one `execute_code` may run.")
    max_output_chars: int = Field(8000, gt=0, description="Output kept per call; the rest is cut.")


class PromptsConfig(_Section):
    domain_preamble: str | None = Field(
        None, description="Prepended to the RAG instructions, e.g. what the corpus is about."
    )


class StorageConfig(_Section):
    data_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_data_dir("haiku.rag")),
        description="Where the default knowledge base lives.",
    )
    driver: str | None = Field(
        None, description="Storage driver; inferred from the path when unset."
    )
    rags_dir: Path | None = Field(
        None,
        description="Where named knowledge bases (`--rag NAME`) live; `HAIKU_RAG_RAGS_DIR` "
        "overrides it. Unset: `<data_dir>/rags`.",
    )

    @property
    def default_db_path(self) -> Path:
        return self.data_dir / "haiku.rag.lancedb"


class AppConfig(_Section):
    embeddings: EmbeddingsConfig = Field(default_factory=EmbeddingsConfig)
    chunking: ChunkingConfig = Field(default_factory=ChunkingConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    graph: GraphConfig = Field(default_factory=GraphConfig)
    qa: QAConfig = Field(default_factory=QAConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    prompts: PromptsConfig = Field(default_factory=PromptsConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    rag_template: str | None = Field(
        None,
        description="Prompt that wraps retrieved context around a question (the context "
        "capability, `ask --inject`): `__INPUT__` and `__CONTEXT__` required, `__SOURCES__` "
        "optional; unset: `haiku.rag.template.DEFAULT_TEMPLATE`.",
    )
    document_loaders: dict[str, str] = Field(
        default_factory=dict,
        description="Commands that turn other files into text: `{name: 'cmd $1 [$2]'}`; "
        "`name:input` sources and files with extension `.name` run them (see docs/sources.md).",
    )
    loader_timeout: float = Field(
        120.0, gt=0, description="Seconds a document loader or a `` `cmd` `` source may run."
    )

    source_path: Path | None = Field(
        None, exclude=True, description="The file this config was loaded from, if any."
    )

    @field_validator("document_loaders")
    @classmethod
    def _loaders_are_valid(cls, value: dict[str, str]) -> dict[str, str]:
        from haiku.rag.sources.loaders import parse_loader

        for name, template in value.items():
            parse_loader(name, template)
        return value

    @field_validator("rag_template")
    @classmethod
    def _template_has_placeholders(cls, value: str | None) -> str | None:
        from haiku.rag.template import validate_template

        return None if value is None else validate_template(value)


def user_config_path() -> Path:
    return Path(platformdirs.user_config_dir("haiku.rag")) / "config.yaml"


def find_config_file(cwd: Path | None = None) -> Path | None:
    """The first config file in load order, or None to use the defaults."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"{CONFIG_ENV} points to {path}, which does not exist; "
                f"create it or unset {CONFIG_ENV}"
            )
        return path
    for candidate in ((cwd or Path.cwd()) / LOCAL_CONFIG_NAME, user_config_path()):
        if candidate.is_file():
            return candidate
    return None


def _describe(error: ValidationError, origin: str) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            lines.append(f"unknown key '{key}'")
        else:
            lines.append(f"'{key}': {item['msg']} (got {item.get('input')!r})")
    return f"Invalid configuration in {origin}: " + "; ".join(lines)


def config_from_dict(data: dict[str, Any], origin: str = "config") -> AppConfig:
    try:
        return AppConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error, origin)) from None


def load_config(path: Path | str | None = None) -> AppConfig:
    """Load `path`, or the first config file in load order, or the defaults."""
    file = Path(path).expanduser() if path is not None else find_config_file()
    if file is None:
        return AppConfig()
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except OSError as error:
        raise ConfigError(f"Cannot read config file {file}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"Config file {file} is not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"Config file {file} must hold a mapping of sections, not {data!r}")
    config = config_from_dict(data, str(file))
    config.source_path = file
    return config
