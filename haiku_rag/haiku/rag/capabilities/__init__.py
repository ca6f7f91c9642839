"""Pydantic AI capabilities for haiku.rag: the RAG tools and their companions.

- `rag.create_capability(...)`: `search`, `execute_code` and `cite`, budgets, state;
- `compaction.create_capability()`: earlier questions keep only their cited evidence;
- `policy.create_capability()`: an uncited final answer is sent back once to cite;
- `context.create_capability(...)`: retrieved context before the first request, `rag__query`;
- `ledger.citation_status(records, question=...)`: audit grounding.

Importing this package is cheap; names are loaded from their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the lazy names, typed for checkers and editors
    from haiku.rag.capabilities.compaction import EvidenceCompaction as EvidenceCompaction
    from haiku.rag.capabilities.context import ContextCapability as ContextCapability
    from haiku.rag.capabilities.context import ContextState as ContextState
    from haiku.rag.capabilities.ledger import CapabilityEvidenceRecord as CapabilityEvidenceRecord
    from haiku.rag.capabilities.ledger import QuestionEvidence as QuestionEvidence
    from haiku.rag.capabilities.ledger import citation_status as citation_status
    from haiku.rag.capabilities.policy import CitationPolicy as CitationPolicy
    from haiku.rag.capabilities.rag import RAGCapability as RAGCapability
    from haiku.rag.capabilities.rag import create_capability as create_capability
    from haiku.rag.capabilities.state import CodeExecutionEntry as CodeExecutionEntry
    from haiku.rag.capabilities.state import RAGDeps as RAGDeps
    from haiku.rag.capabilities.state import RAGState as RAGState

_EXPORTS = {
    "RAGCapability": "rag",
    "create_capability": "rag",
    "RAGState": "state",
    "RAGDeps": "state",
    "CodeExecutionEntry": "state",
    "CapabilityEvidenceRecord": "ledger",
    "QuestionEvidence": "ledger",
    "citation_status": "ledger",
    "EvidenceCompaction": "compaction",
    "CitationPolicy": "policy",
    "ContextCapability": "context",
    "ContextState": "context",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
