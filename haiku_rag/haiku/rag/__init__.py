"""haiku.rag: a grounded knowledge base for Pydantic AI agents.

The public API, re-exported; import from here rather than from submodules.
"""

from haiku.rag.capabilities.ledger import citation_status
from haiku.rag.capabilities.state import RAGDeps, RAGState
from haiku.rag.client import HaikuRAG, StoreInfo
from haiku.rag.config import AppConfig, load_config
from haiku.rag.documents import Chunk, Citation, Document, SearchResult
from haiku.rag.embeddings import EmbeddingService
from haiku.rag.ephemeral import ask_ephemeral
from haiku.rag.errors import (
    ConfigError,
    EmbeddingError,
    ExtractionError,
    HaikuRAGError,
    ReadOnlyError,
    SourceError,
    StoreError,
    StoreNotFoundError,
)
from haiku.rag.ingest import AddReport
from haiku.rag.retrieval.extract import ChunkExtractor
from haiku.rag.sources import SourceFailure

__all__ = [
    "AddReport",
    "AppConfig",
    "Chunk",
    "ChunkExtractor",
    "Citation",
    "ConfigError",
    "Document",
    "EmbeddingError",
    "EmbeddingService",
    "ExtractionError",
    "HaikuRAG",
    "HaikuRAGError",
    "RAGDeps",
    "RAGState",
    "ReadOnlyError",
    "SearchResult",
    "SourceError",
    "SourceFailure",
    "StoreError",
    "StoreInfo",
    "StoreNotFoundError",
    "ask_ephemeral",
    "citation_status",
    "load_config",
]
