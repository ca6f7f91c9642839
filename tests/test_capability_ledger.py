"""The evidence ledger and RAGState: pure data, no agent, no store."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from haiku.rag.capabilities import ledger
from haiku.rag.capabilities.ledger import (
    CapabilityEvidenceRecord,
    QuestionEvidence,
    citation_status,
    entry_status,
    question_entry,
)
from haiku.rag.capabilities.rag import (
    closest_id,
    edit_distance,
    normalize_chunk_id,
    render_results,
)
from haiku.rag.capabilities.state import (
    RAGDeps,
    RAGState,
    find_state,
    load_state,
    prompt_text,
    state_container,
)
from haiku.rag.documents import SearchResult


def result(chunk_id: str, **extra: object) -> SearchResult:
    fields = {
        "chunk_id": chunk_id,
        "document_id": "doc" + chunk_id,
        "document_uri": f"mem://{chunk_id}",
        "document_title": f"Title {chunk_id}",
        "content": f"content of {chunk_id}",
        "score": 1.0,
        "rank": 1,
    }
    fields.update(extra)
    return SearchResult.model_validate(fields)


# ledger ------------------------------------------------------------------------------


def test_status_sequence_missing_grounded_ungrounded_missing():
    record = CapabilityEvidenceRecord()
    assert citation_status(record) == "missing"  # no question at all
    record.start_question("q1")
    assert citation_status(record, question="q1") == "missing"  # nothing happened yet
    record.record_retrieved("search", ["a", "b"], "lance")
    assert citation_status(record, question="q1") == "missing"
    record.record_declared(["a"])
    assert citation_status(record, question="q1") == "grounded"
    record.record_declared([])
    assert citation_status(record, question="q1") == "ungrounded"  # latest declaration wins
    record.record_retrieved("execute_code", ["c"], "more")
    assert citation_status(record, question="q1") == "missing"  # evidence newer than cite
    record.record_declared(["c"])
    assert citation_status(record) == "grounded"


def test_sequence_numbers_only_grow_across_questions():
    record = CapabilityEvidenceRecord()
    record.start_question("q1")
    first = record.record_retrieved("search", ["a"])
    record.start_question("q2")
    second = record.record_declared(["a"])
    assert second.seq == first.seq + 1 and record.next_seq == 3


def test_declaration_without_retrieval_and_empty_search():
    record = CapabilityEvidenceRecord()
    record.start_question("chit-chat")
    record.record_declared([])
    assert citation_status(record, question="chit-chat") == "ungrounded"
    record.start_question("known ids")
    record.record_declared(["x"])
    assert citation_status(record, question="known ids") == "grounded"
    record.record_retrieved("search", [], "nothing found")  # an empty search is still evidence
    assert citation_status(record, question="known ids") == "missing"


def test_question_lookup_uses_latest_entry_and_unknown_is_missing():
    record = CapabilityEvidenceRecord()
    record.start_question("same")
    record.record_declared(["a"])
    record.start_question("same")  # asked again in a fresh conversation
    assert citation_status(record, question="same") == "missing"
    assert citation_status(record, question="never asked") == "missing"
    assert question_entry(record.questions, "same") is record.questions[-1]
    assert citation_status(record.questions[:1], question="same") == "grounded"
    assert entry_status(None) == "missing"


def test_record_without_question_opens_an_anonymous_one():
    record = CapabilityEvidenceRecord()
    record.record_retrieved("search", ["a", "b", "a"])
    record.record_declared(["b", "b"])
    entry = record.current()
    assert entry is not None and entry.question == ""
    assert entry.retrieved == ["a", "b"] and entry.cited == ["b"]


def test_records_round_trip_through_json():
    record = CapabilityEvidenceRecord()
    record.start_question("q")
    record.record_retrieved("search", ["a"], "query")
    record.record_declared(["a"])
    restored = CapabilityEvidenceRecord.model_validate_json(record.model_dump_json())
    assert restored == record and citation_status(restored, question="q") == "grounded"
    assert ledger.CitationStatus.__args__ == ("missing", "grounded", "ungrounded")  # type: ignore[attr-defined]


# state -------------------------------------------------------------------------------


def test_start_question_clears_working_set_and_keeps_the_rest():
    state = RAGState(document_filter="docs/", sources=["mem://a"])
    state.start_question("q1")
    state.searches["x"] = [result("a")]
    state.search_calls = 3
    first = state.register_citation(result("a"))
    state.start_question("q2")
    assert state.citations == [] and state.searches == {} and state.executions == []
    assert state.search_calls == 0 and state.question == "q2"
    assert state.document_filter == "docs/" and state.sources == ["mem://a"]
    assert state.citation_index["a"] == first and len(state.evidence.questions) == 2


def test_citation_indexes_are_stable_across_questions():
    state = RAGState()
    state.start_question("q1")
    a = state.register_citation(result("a"))
    b = state.register_citation(result("b"))
    assert (a.index, b.index) == (1, 2)
    assert state.register_citation(result("a")) is a and state.citations == ["a", "b"]
    state.start_question("q2")
    assert state.register_citation(result("b")).index == 2
    c = state.register_citation(result("c"))
    assert c.index == 3 and [cit.chunk_id for cit in state.cited()] == ["b", "c"]


def test_retrieved_results_merges_tool_and_code_searches():
    state = RAGState()
    state.searches = {"q": [result("a"), result("b")], "[code] q2": [result("b"), result("c")]}
    assert list(state.retrieved_results()) == ["a", "b", "c"]


def test_load_state_creates_validates_and_stores_back():
    assert load_state(object()) is None and load_state(SimpleNamespace(state=None)) is None
    deps = RAGDeps()
    state = load_state(deps)
    assert isinstance(state, RAGState) and deps.state["rag"] is state
    assert load_state(deps) is state

    state.start_question("q")
    state.register_citation(result("a"))
    as_dict = RAGDeps(state={"rag": json.loads(state.model_dump_json())})
    restored = load_state(as_dict)
    assert isinstance(restored, RAGState) and restored.citation_index["a"].index == 1
    assert as_dict.state["rag"] is restored

    as_json = RAGDeps(state={"rag": state.model_dump_json()})
    assert load_state(as_json) == state
    assert state_container(SimpleNamespace(state={})) == {}


def test_find_state_prefers_deps_then_a_capability():
    deps_state = RAGState()
    own = RAGState()

    class Holder:
        def rag_state(self, ctx: object) -> RAGState:
            return own

    ctx = SimpleNamespace(deps=RAGDeps(state={"rag": deps_state}), capabilities={"x": Holder()})
    assert find_state(ctx) is deps_state  # type: ignore[arg-type]
    ctx = SimpleNamespace(deps=None, capabilities={"a": object(), "x": Holder()})
    assert find_state(ctx) is own  # type: ignore[arg-type]
    assert find_state(SimpleNamespace(deps=None, capabilities={})) is None  # type: ignore[arg-type]


def test_prompt_text():
    assert prompt_text(None) is None and prompt_text("hi") == "hi"
    assert prompt_text(["a", object(), "b"]) == "a\nb"


def test_question_evidence_defaults():
    entry = QuestionEvidence(question="q")
    assert entry.retrieved == [] and entry.cited == [] and not entry.reminded


# id matching and rendering -----------------------------------------------------------


def test_edit_distance_and_closest_id():
    assert edit_distance("abcdef", "abcdef", 2) == 0
    assert edit_distance("abcdef", "abcxef", 2) == 1
    assert edit_distance("abcdef", "abdcef", 2) == 2
    assert edit_distance("abcdef", "zzzzzz", 2) == 3  # stops early
    assert edit_distance("abc", "abcdefg", 2) == 3  # length gap alone exceeds the limit
    known = ["0123456789abcdef", "fedcba9876543210"]
    assert closest_id("0123456789abcdee", known) == "0123456789abcdef"
    assert closest_id("0123456789abcd", known) == "0123456789abcdef"  # two dropped
    assert closest_id("0123456789000000", known) is None
    assert closest_id("aaaa", ["aaab", "aaac"]) is None  # ambiguous: no guess
    assert closest_id("x", []) is None


def test_normalize_chunk_id():
    assert normalize_chunk_id("  [ABCDEF0123456789] ") == "abcdef0123456789"
    assert normalize_chunk_id("chunk_id: abc") == "abc"
    assert normalize_chunk_id("`id:abc`") == "abc"


def test_render_results():
    assert render_results("q", []) == 'No results for "q".'
    text = render_results(
        "q", [result("a", headings=["H1", "H2"]), result("b", document_title=None)]
    )
    assert text.startswith('2 results for "q":')
    assert "[chunk_id: a] rank 1 | Title a" in text and "uri: mem://a" in text
    assert "section: H1 > H2" in text and "content of a" in text
    assert "[chunk_id: b] rank 1 | mem://b" in text


@pytest.mark.parametrize("name", ["RAGState", "citation_status", "create_capability", "RAGDeps"])
def test_package_exports_lazily(name: str):
    import haiku.rag.capabilities as capabilities

    assert getattr(capabilities, name) is not None
    with pytest.raises(AttributeError):
        capabilities.nope  # noqa: B018
