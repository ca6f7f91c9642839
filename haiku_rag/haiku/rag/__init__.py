"""haiku.rag: a grounded knowledge base for Pydantic AI agents.

The public API, re-exported; import from here rather than from submodules.
"""

from haiku.rag.client import HaikuRAG, StoreInfo
from haiku.rag.config import AppConfig, load_config
from haiku.rag.documents import Chunk, Citation, Document, SearchResult
from haiku.rag.embeddings import EmbeddingService
from haiku.rag.errors import (
    ConfigError,
    EmbeddingError,
    HaikuRAGError,
    ReadOnlyError,
    SourceError,
    StoreError,
    StoreNotFoundError,
)
from haiku.rag.ingest import AddReport

__all__ = [
    "AddReport",
    "AppConfig",
    "Chunk",
    "Citation",
    "ConfigError",
    "Document",
    "EmbeddingError",
    "EmbeddingService",
    "HaikuRAG",
    "HaikuRAGError",
    "ReadOnlyError",
    "SearchResult",
    "SourceError",
    "StoreError",
    "StoreInfo",
    "StoreNotFoundError",
    "load_config",
]
