"""The evidence ledger: what was retrieved and what was cited, question by question.

A record is an append-only list of events per question, each stamped with a
sequence number that only grows (across runs, since the record lives in the
run's state). `citation_status` reads it: a declaration (a `cite` call) counts
only when it is newer than the latest retrieval, so searching after citing puts
the question back to `missing` until the model cites again.

Everything here is plain data and pure functions, so a test (or an auditor)
can check grounding without running an agent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, Field

CitationStatus = Literal["missing", "grounded", "ungrounded"]
EventKind = Literal["retrieved", "declared"]


class EvidenceEvent(BaseModel):
    """One thing the capability saw happen: chunks retrieved by a tool, or a cite call."""

    seq: int
    kind: EventKind
    tool: str
    """`search`, `execute_code` or `cite` (or whatever recorded it)."""
    chunk_ids: list[str] = Field(default_factory=list)
    query: str | None = None


class QuestionEvidence(BaseModel):
    """The events of one question, in order, plus the policy's notes about it."""

    question: str
    events: list[EvidenceEvent] = Field(default_factory=list)
    reminded: bool = False
    """The policy already sent the model back once to cite for this question."""
    violations: list[str] = Field(default_factory=list)

    @property
    def retrieved(self) -> list[str]:
        """Chunk ids retrieved in this question, first occurrence order."""
        return _unique(cid for e in self.events if e.kind == "retrieved" for cid in e.chunk_ids)

    @property
    def cited(self) -> list[str]:
        """Chunk ids cited in this question, first occurrence order."""
        return _unique(cid for e in self.events if e.kind == "declared" for cid in e.chunk_ids)


class CapabilityEvidenceRecord(BaseModel):
    """Every question's evidence; the last entry is the question being answered."""

    questions: list[QuestionEvidence] = Field(default_factory=list)
    next_seq: int = 1

    def current(self) -> QuestionEvidence | None:
        return self.questions[-1] if self.questions else None

    def start_question(self, question: str) -> QuestionEvidence:
        entry = QuestionEvidence(question=question)
        self.questions.append(entry)
        return entry

    def _record(
        self, kind: EventKind, tool: str, chunk_ids: Sequence[str], query: str | None
    ) -> EvidenceEvent:
        entry = self.current()
        if entry is None:
            entry = self.start_question("")
        event = EvidenceEvent(
            seq=self.next_seq, kind=kind, tool=tool, chunk_ids=list(chunk_ids), query=query
        )
        self.next_seq += 1
        entry.events.append(event)
        return event

    def record_retrieved(
        self, tool: str, chunk_ids: Sequence[str], query: str | None = None
    ) -> EvidenceEvent:
        """Chunks a tool put in front of the model (even none: a search still happened)."""
        return self._record("retrieved", tool, chunk_ids, query)

    def record_declared(self, chunk_ids: Sequence[str], tool: str = "cite") -> EvidenceEvent:
        """A cite call; an empty list declares the answer ungrounded."""
        return self._record("declared", tool, chunk_ids, None)


Records = CapabilityEvidenceRecord | Sequence[QuestionEvidence]


def _unique(ids: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for cid in ids:
        seen.setdefault(cid, None)
    return list(seen)


def question_entry(records: Records, question: str | None = None) -> QuestionEvidence | None:
    """The latest entry for `question` (the latest entry overall when None)."""
    entries = records.questions if isinstance(records, CapabilityEvidenceRecord) else records
    for entry in reversed(entries):
        if question is None or entry.question == question:
            return entry
    return None


def entry_status(entry: QuestionEvidence | None) -> CitationStatus:
    """`grounded`/`ungrounded` by the latest declaration newer than every retrieval."""
    if entry is None:
        return "missing"
    latest_retrieval = max((e.seq for e in entry.events if e.kind == "retrieved"), default=0)
    declarations = [e for e in entry.events if e.kind == "declared" and e.seq > latest_retrieval]
    if not declarations:
        return "missing"
    latest = max(declarations, key=lambda e: e.seq)
    return "grounded" if latest.chunk_ids else "ungrounded"


def citation_status(records: Records, question: str | None = None) -> CitationStatus:
    """`missing`, `grounded` or `ungrounded` for `question` (default: the latest one).

    - missing: nothing declared since the latest retrieval (or the question is unknown);
    - grounded: the latest such declaration cites at least one chunk;
    - ungrounded: it was an empty cite, an answer declared not to rest on the corpus.
    """
    return entry_status(question_entry(records, question))
