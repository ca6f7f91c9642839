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
from typing import Any

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
