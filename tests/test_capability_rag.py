"""The RAG capability driven by a real Agent (FunctionModel scripts) over a real LanceDB store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from haiku.rag.capabilities.ledger import citation_status
from haiku.rag.capabilities.rag import RAGCapability, create_capability
from haiku.rag.capabilities.state import RAGDeps, RAGState
from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig, config_from_dict
from haiku.rag.documents import document_id_for
from haiku.rag.errors import StoreNotFoundError

DOCS = {
    "mem://manuals/safety.md": (
        "Safety manual",
        "# Safety\n\nEvery operator must wear a hard hat, steel-toe boots and hearing "
        "protection on the factory floor.",
    ),
    "mem://manuals/lancedb.md": (
        "LanceDB",
        "# LanceDB\n\nLanceDB is an embedded vector database built on the Lance columnar format.",
    ),
    "mem://cooking/pasta.md": (
        "Pasta",
        "# Pasta\n\nBoil salted water, add the spaghetti and cook for nine minutes.",
    ),
    "mem://cooking/bread.md": (
        "Bread",
        "Sourdough bread needs a lively starter, flour, water and salt.",
    ),
}


def make_config(tmp: Path, **sections: Any) -> AppConfig:
    data: dict[str, Any] = {
        "embeddings": {"model": "hash:v1", "dimension": 256},
        "storage": {"data_dir": str(tmp / "data")},
    }
    data.update(sections)
    return config_from_dict(data)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, AppConfig]:
    """One store for the module: tests only read it."""
    tmp = tmp_path_factory.mktemp("kb")
    config = make_config(tmp)
    path = tmp / "kb.lancedb"

    async def build() -> None:
        async with HaikuRAG(path, config, create=True) as kb:
            for uri, (title, text) in DOCS.items():
                await kb.add_text(text, uri=uri, title=title)

    asyncio.run(build())
    return path, config


@pytest.fixture
def db(store: tuple[Path, AppConfig]) -> Path:
    return store[0]


@pytest.fixture
def cfg(store: tuple[Path, AppConfig]) -> AppConfig:
    return store[1]


# script helpers --------------------------------------------------------------------------

Step = ModelResponse | Callable[[list[ModelMessage], AgentInfo], ModelResponse]


def call(tool: str, **args: Any) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool, args)])


def text(content: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content)])


class Script:
    """A FunctionModel body that plays `steps` in order and records what each request saw."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.infos: list[AgentInfo] = []
        self.seen: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.infos.append(info)
        self.seen.append(list(messages))
        index = len(self.infos) - 1
        step = self.steps[index] if index < len(self.steps) else text("done")
        return step(messages, info) if callable(step) else step

    @property
    def model(self) -> FunctionModel:
        return FunctionModel(self)

    def tools(self, index: int) -> list[str]:
        return [tool.name for tool in self.infos[index].function_tools]


def last_parts(messages: list[ModelMessage]) -> list[Any]:
    request = messages[-1]
    assert isinstance(request, ModelRequest)
    return list(request.parts)


def last_return(messages: list[ModelMessage]) -> ToolReturnPart:
    part = last_parts(messages)[0]
    assert isinstance(part, ToolReturnPart), part
    return part


def is_retry(part: Any) -> bool:
    """A ModelRetry from a tool comes back as a 'retried' tool return (or a retry prompt)."""
    return isinstance(part, RetryPromptPart) or getattr(part, "outcome", None) == "retried"


def cite_first(k: int = 1) -> Step:
    """Cite the first `k` chunk ids of the latest search return."""

    def step(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        ids = last_return(messages).metadata["chunk_ids"][:k]
        return call("cite", chunk_ids=ids)

    return step


def agent_for(script: Script, capability: RAGCapability, **kwargs: Any) -> Agent[Any, str]:
    return Agent(script.model, capabilities=[capability], deps_type=RAGDeps, **kwargs)


# grounding statuses ------------------------------------------------------------------------


async def test_search_then_cite_is_grounded(db: Path, cfg: AppConfig):
    script = Script(call("search", query="hard hat safety"), cite_first(), text("Hard hats [1]."))
    deps = RAGDeps()
    result = await agent_for(script, create_capability(db, cfg)).run(
        "What safety equipment is required?", deps=deps
    )
    assert result.output == "Hard hats [1]."
    state: RAGState = deps.state["rag"]
    assert citation_status(state.evidence, question="What safety equipment is required?") == (
        "grounded"
    )
    rendered = last_return(script.seen[1])
    assert rendered.tool_name == "search"
    first_id = rendered.metadata["chunk_ids"][0]
    assert f"[chunk_id: {first_id}] rank 1 | Safety manual" in rendered.content
    assert "uri: mem://manuals/safety.md" in rendered.content
    assert "section: Safety" in rendered.content and "hard hat" in rendered.content
    assert list(state.searches) == ["hard hat safety"]
    assert state.citations == [first_id] and state.citation_index[first_id].index == 1
    cite_return = last_return(script.seen[2])
    assert cite_return.content.startswith("Registered citations:\n[1] Safety manual")
    assert cite_return.metadata["citations"][0]["chunk_id"] == first_id
    # instructions: the shipped text, no budget note
    assert "`cite(chunk_ids)`" in (script.infos[0].instructions or "")
    assert "budget" not in (script.infos[2].instructions or "").split("Rules:")[0]


async def test_no_cite_is_missing(db: Path, cfg: AppConfig):
    script = Script(call("search", query="lancedb"), text("LanceDB is a database."))
    deps = RAGDeps()
    await agent_for(script, create_capability(db, cfg)).run("What is LanceDB?", deps=deps)
    assert citation_status(deps.state["rag"].evidence, question="What is LanceDB?") == "missing"


async def test_empty_cite_is_ungrounded(db: Path, cfg: AppConfig):
    script = Script(call("search", query="moon landing"), call("cite", chunk_ids=[]), text("?"))
    deps = RAGDeps()
    await agent_for(script, create_capability(db, cfg)).run("Who landed on the moon?", deps=deps)
    state = deps.state["rag"]
    assert citation_status(state.evidence) == "ungrounded" and state.citations == []
    assert "ungrounded" in last_return(script.seen[2]).content


async def test_search_after_cite_is_missing_again(db: Path, cfg: AppConfig):
    script = Script(
        call("search", query="safety"),
        cite_first(),
        call("search", query="boots"),
        text("Boots."),
    )
    deps = RAGDeps()
    await agent_for(script, create_capability(db, cfg)).run("Boots?", deps=deps)
    assert citation_status(deps.state["rag"].evidence, question="Boots?") == "missing"


# search restrictions ------------------------------------------------------------------------


async def test_document_filter_and_sources_restrict_search(db: Path, cfg: AppConfig):
    deps = RAGDeps(state={"rag": RAGState(document_filter="cooking")})
    script = Script(call("search", query="safety hard hat", top_k=10), text("x"))
    await agent_for(script, create_capability(db, cfg)).run("q", deps=deps)
    uris = {r.document_uri for r in deps.state["rag"].searches["safety hard hat"]}
    assert uris and uris <= {"mem://cooking/pasta.md", "mem://cooking/bread.md"}

    deps = RAGDeps(state={"rag": RAGState(sources=["mem://manuals/lancedb.md", "*bread*"])})
    script = Script(call("search", query="safety", top_k=10), text("x"))
    await agent_for(script, create_capability(db, cfg)).run("q", deps=deps)
    uris = {r.document_uri for r in deps.state["rag"].searches["safety"]}
    assert uris == {"mem://manuals/lancedb.md", "mem://cooking/bread.md"}

    # both: the intersection; here nothing, so the model is told there are no results
    deps = RAGDeps(state={"rag": RAGState(document_filter="manuals", sources=["*bread*"])})
    script = Script(call("search", query="bread"), text("x"))
    await agent_for(script, create_capability(db, cfg)).run("q", deps=deps)
    assert last_return(script.seen[1]).content == 'No results for "bread".'


async def test_sources_accept_document_ids_and_file_paths(db: Path, cfg: AppConfig, tmp_path: Path):
    kb = await HaikuRAG(db, cfg, read_only=True).open()
    try:
        capability = create_capability(rag=kb)
        path = tmp_path / "notes.md"
        path.write_text("x")
        state = RAGState(sources=[document_id_for("mem://cooking/pasta.md"), str(path)])
        allowed = await capability.allowed_document_ids(kb, state)
        assert allowed is not None
        assert document_id_for("mem://cooking/pasta.md") in allowed
        assert document_id_for(path.resolve().as_uri()) in allowed
    finally:
        kb.close()


# cite resolution ----------------------------------------------------------------------------


async def test_cite_tolerates_typos_and_rejects_unknown_ids(db: Path, cfg: AppConfig):
    ids: list[str] = []

    def typo(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        ids.extend(last_return(messages).metadata["chunk_ids"])
        good = ids[0]
        wrong = good[:-1] + ("0" if good[-1] != "0" else "1")
        return call("cite", chunk_ids=[f"[{wrong.upper()}]", "ffffffffffffffff"])

    def fix(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        retry = last_parts(messages)[0]
        assert is_retry(retry)
        assert "Unknown chunk ids: ffffffffffffffff" in str(retry.content)
        assert ids[0] in str(retry.content)  # the valid ones are listed
        assert "Nothing was registered" in str(retry.content)
        good = ids[0]
        return call("cite", chunk_ids=[good[:-1] + ("0" if good[-1] != "0" else "1")])

    script = Script(call("search", query="pasta spaghetti"), typo, fix, text("ok"))
    deps = RAGDeps()
    await agent_for(script, create_capability(db, cfg)).run("Pasta?", deps=deps)
    state = deps.state["rag"]
    assert state.citations == [ids[0]]  # the typo resolved to the retrieved id
    assert citation_status(state.evidence) == "grounded"


async def test_cite_resolves_ids_from_the_store(db: Path, cfg: AppConfig):
    kb = await HaikuRAG(db, cfg, read_only=True).open()
    try:
        chunk = kb.store.document_chunks(document_id_for("mem://cooking/bread.md"))[0]
    finally:
        kb.close()
    script = Script(call("cite", chunk_ids=[chunk.id]), text("Bread [1]."))
    deps = RAGDeps()
    await agent_for(script, create_capability(db, cfg)).run("Bread?", deps=deps)
    citation = deps.state["rag"].citation_index[chunk.id]
    assert citation.document_uri == "mem://cooking/bread.md" and citation.document_title == "Bread"
    assert citation_status(deps.state["rag"].evidence) == "grounded"


async def test_cite_from_the_store_respects_the_document_filter(db: Path, cfg: AppConfig):
    kb = await HaikuRAG(db, cfg, read_only=True).open()
    try:
        bread = kb.store.document_chunks(document_id_for("mem://cooking/bread.md"))[0]
    finally:
        kb.close()
    script = Script(call("cite", chunk_ids=[bread.id]), text("giving up"))
    deps = RAGDeps(state={"rag": RAGState(document_filter="*manuals*")})
    await agent_for(script, create_capability(db, cfg)).run("Bread?", deps=deps)
    retry = last_parts(script.seen[1])[0]
    assert is_retry(retry) and f"Unknown chunk ids: {bread.id}" in str(retry.content)
    assert deps.state["rag"].citations == []
    assert citation_status(deps.state["rag"].evidence) == "missing"


async def test_cite_out_of_retries_fails_without_ending_the_run(db: Path, cfg: AppConfig):
    script = Script(*(call("cite", chunk_ids=["nope"]) for _ in range(5)), text("No sources."))
    deps = RAGDeps()
    result = await agent_for(script, create_capability(db, cfg)).run("x", deps=deps)
    assert result.output == "No sources."
    failed = last_parts(script.seen[3])[0]
    assert "Or answer without citations" in str(failed.content)
    assert citation_status(deps.state["rag"].evidence) == "missing"


async def test_cite_before_any_search_with_a_bad_id_says_search_first(db: Path, cfg: AppConfig):
    def check(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        retry = last_parts(messages)[0]
        assert is_retry(retry) and "search first" in str(retry.content)
        return text("giving up")

    script = Script(call("cite", chunk_ids=["nope"]), check)
    await agent_for(script, create_capability(db, cfg)).run("x", deps=RAGDeps())
    assert len(script.infos) == 2


# budgets ------------------------------------------------------------------------------------


async def test_request_limit_leaves_cite_for_two_requests_then_nothing(db: Path, cfg: AppConfig):
    def weather(city: str) -> str:
        """Other tools are not the capability's business."""
        return f"sunny in {city}"

    script = Script(
        call("search", query="safety"),  # 1
        call("search", query="boots"),  # 2 = the limit
        call("weather", city="Oslo"),  # 3: only cite (+ weather); a non-capability call
        cite_first_from_history(),  # 4: still cite: weather did not count
        cite_first_from_history(),  # 5: second grace request
        text("Hard hats [1]."),  # 6: nothing of ours left
    )
    capability = create_capability(db, cfg, request_limit=2)
    agent = agent_for(script, capability, tools=[weather])
    deps = RAGDeps()
    await agent.run("Safety gear?", deps=deps)
    assert script.tools(0) == ["weather", "search", "execute_code", "cite"]
    assert script.tools(1) == ["weather", "search", "execute_code", "cite"]
    assert script.tools(2) == ["weather", "cite"]
    assert script.tools(3) == ["weather", "cite"]
    assert script.tools(4) == ["weather", "cite"]
    assert script.tools(5) == ["weather"]
    assert "request limit of this run is reached (2 requests)" in (
        script.infos[2].instructions or ""
    )
    assert "request limit" not in (script.infos[1].instructions or "").split("Rules:")[1]
    assert citation_status(deps.state["rag"].evidence) == "grounded"

    # each run starts a fresh limit
    again = Script(text("fresh"))
    await agent_for(again, capability, tools=[weather]).run("Safety gear?", deps=deps)
    assert again.tools(0) == ["weather", "search", "execute_code", "cite"]


def cite_first_from_history() -> Step:
    def step(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for message in reversed(messages):
            if isinstance(message, ModelRequest):
                for part in message.parts:
                    if isinstance(part, ToolReturnPart) and part.tool_name == "search":
                        return call("cite", chunk_ids=part.metadata["chunk_ids"][:1])
        raise AssertionError("no search in history")

    return step


async def test_no_request_limit(db: Path, cfg: AppConfig):
    script = Script(*[call("search", query=f"q{i}") for i in range(3)], text("x"))
    config = cfg.model_copy(update={"qa": cfg.qa.model_copy(update={"max_searches": 50})})
    await agent_for(script, create_capability(db, config, request_limit=None)).run(
        "x", deps=RAGDeps()
    )
    assert all("search" in script.tools(i) for i in range(4))


async def test_max_searches_spent_fails_and_instructions_name_it(db: Path, cfg: AppConfig):
    config = cfg.model_copy(update={"qa": cfg.qa.model_copy(update={"max_searches": 1})})
    script = Script(
        call("search", query="safety"),
        call("search", query="boots"),
        call("search", query="again"),
        text("done"),
    )
    deps = RAGDeps()
    await agent_for(script, create_capability(db, config)).run("Safety?", deps=deps)
    for index in (1, 2, 3):
        assert "search" in script.tools(index)  # stays declared: the tool list is stable
        assert "`search` budget of this question is spent (qa.max_searches = 1)" in (
            script.infos[index].instructions or ""
        )
    assert "budget of this question" not in (script.infos[0].instructions or "")
    failed = last_return(script.seen[2])
    assert failed.outcome == "failed"
    assert "search budget of this question is spent" in failed.content
    assert "answer now" in failed.content
    state = deps.state["rag"]
    assert state.search_calls == 1 and list(state.searches) == ["safety"]


async def test_budget_is_per_question_across_runs(db: Path, cfg: AppConfig):
    config = cfg.model_copy(update={"qa": cfg.qa.model_copy(update={"max_searches": 1})})
    capability = create_capability(db, config)
    deps = RAGDeps()
    first = Script(call("search", query="safety"), text("a"))
    result = await agent_for(first, capability).run("Q1", deps=deps)
    resumed = Script(call("search", query="more"), text("b"))
    result = await agent_for(resumed, capability).run(
        "Q1", deps=deps, message_history=result.all_messages()
    )
    assert last_return(resumed.seen[1]).outcome == "failed"  # same question: budget spent
    fresh = Script(call("search", query="pasta"), text("c"))
    await agent_for(fresh, capability).run("Q2", deps=deps, message_history=result.all_messages())
    assert last_return(fresh.seen[1]).outcome != "failed"  # a new question: a new budget


# state across runs --------------------------------------------------------------------------


async def test_state_persistence_rules_across_runs(db: Path, cfg: AppConfig):
    capability = create_capability(db, cfg)
    state = RAGState(document_filter="manuals")
    deps = RAGDeps(state={"rag": state})

    one = Script(call("search", query="hard hat"), cite_first(), text("Hard hats [1]."))
    first = await agent_for(one, capability).run("Q1: safety?", deps=deps)
    cited = list(state.citations)
    assert cited and state.searches and citation_status(state.evidence) == "grounded"
    history = first.all_messages()
    frozen = ModelMessagesTypeAdapter.dump_json(history)

    # a new question with the conversation's history: working set cleared, the rest kept
    two = Script(call("search", query="vector database"), text("LanceDB."))
    second = await agent_for(two, capability).run(
        "Q2: lancedb?", deps=deps, message_history=history
    )
    assert deps.state["rag"] is state
    assert list(state.searches) == ["vector database"] and state.citations == []
    assert state.document_filter == "manuals" and cited[0] in state.citation_index
    assert [q.question for q in state.evidence.questions] == ["Q1: safety?", "Q2: lancedb?"]
    assert citation_status(state.evidence, question="Q1: safety?") == "grounded"
    assert citation_status(state.evidence, question="Q2: lancedb?") == "missing"
    assert ModelMessagesTypeAdapter.dump_json(history) == frozen  # history never altered

    # the same question resumed (history, same prompt): evidence and searches kept
    three = Script(cite_first_from_history(), text("LanceDB [2]."))
    third = await agent_for(three, capability).run(
        "Q2: lancedb?", deps=deps, message_history=second.all_messages()
    )
    assert list(state.searches) == ["vector database"] and len(state.evidence.questions) == 2
    assert citation_status(state.evidence, question="Q2: lancedb?") == "grounded"
    assert state.citation_index[state.citations[0]].index == 2

    # a run with no prompt continues the history's last question
    four = Script(text("still Q2"))
    await agent_for(four, capability).run(deps=deps, message_history=third.all_messages())
    assert len(state.evidence.questions) == 2 and state.citations

    # the same question without history is a new question
    five = Script(text("again"))
    await agent_for(five, capability).run("Q2: lancedb?", deps=deps)
    assert len(state.evidence.questions) == 3 and state.citations == []
    assert citation_status(state.evidence, question="Q2: lancedb?") == "missing"

    # state that went through JSON (a UI, a session store) is picked up again
    deps_json = RAGDeps(state={"rag": state.model_dump(mode="json")})
    six = Script(call("search", query="boots"), text("x"))
    await agent_for(six, capability).run("Q3", deps=deps_json)
    restored = deps_json.state["rag"]
    assert isinstance(restored, RAGState) and restored.document_filter == "manuals"
    assert len(restored.evidence.questions) == 4 and restored.citation_index.keys() == (
        state.citation_index.keys()
    )


async def test_works_without_state_in_deps(db: Path, cfg: AppConfig):
    capability = create_capability(db, cfg)
    script = Script(call("search", query="bread"), cite_first(), text("Bread [1]."))
    agent = Agent(script.model, capabilities=[capability])
    result = await agent.run("Bread?")
    assert result.output == "Bread [1]."
    assert "Registered citations" in last_return(script.seen[2]).content


# lifecycle ----------------------------------------------------------------------------------


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> list[HaikuRAG]:
    closed: list[HaikuRAG] = []
    original = HaikuRAG.close

    def spy(self: HaikuRAG) -> None:
        if self._store is not None:
            closed.append(self)
        original(self)

    monkeypatch.setattr(HaikuRAG, "close", spy)
    return closed


async def test_own_client_is_closed_and_borrowed_is_not(
    db: Path, cfg: AppConfig, closes: list[HaikuRAG]
):
    script = Script(call("search", query="safety"), text("x"))
    await agent_for(script, create_capability(db, cfg)).run("q", deps=RAGDeps())
    assert len(closes) == 1 and closes[0].read_only

    async with HaikuRAG(db, cfg, read_only=True) as kb:
        script = Script(call("search", query="safety"), text("x"))
        await agent_for(script, create_capability(rag=kb)).run("q", deps=RAGDeps())
        assert len(closes) == 1
        assert kb._store is not None  # still open: the caller owns it
    assert len(closes) == 2  # closed by its own `async with`


async def test_own_client_closed_when_the_run_fails(
    db: Path, cfg: AppConfig, closes: list[HaikuRAG]
):
    def boom(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise RuntimeError("model exploded")

    script = Script(call("search", query="safety"), boom)
    with pytest.raises(RuntimeError, match="model exploded"):
        await agent_for(script, create_capability(db, cfg)).run("q", deps=RAGDeps())
    assert len(closes) == 1


async def test_deferred_loading_opens_on_first_tool_call(
    db: Path, cfg: AppConfig, closes: list[HaikuRAG]
):
    capability = create_capability(db, cfg, defer_loading=True)
    idle = Script(text("no knowledge needed"))
    await agent_for(idle, capability).run("hi", deps=RAGDeps())
    assert idle.tools(0) == ["load_capability"] and closes == []  # never opened

    script = Script(
        call("load_capability", id="haiku_rag"),
        call("search", query="safety"),
        cite_first(),
        text("x"),
    )
    deps = RAGDeps()
    await agent_for(script, capability).run("q", deps=deps)
    assert "search" in script.tools(1)
    assert citation_status(deps.state["rag"].evidence) == "grounded"
    assert len(closes) == 1  # released by the toolset even though wrap_run never wrapped it


async def test_missing_store_fails_before_the_first_request(tmp_path: Path, cfg: AppConfig):
    script = Script(text("never"))
    agent = agent_for(script, create_capability(tmp_path / "none.lancedb", cfg))
    with pytest.raises(StoreNotFoundError):
        await agent.run("q", deps=RAGDeps())
    assert script.infos == []


# factory ------------------------------------------------------------------------------------


def test_db_path_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: AppConfig):
    assert create_capability("given.lancedb", cfg).db_path == Path("given.lancedb")
    monkeypatch.setenv("HAIKU_RAG_DB", str(tmp_path / "env.lancedb"))
    assert create_capability(config=cfg).db_path == tmp_path / "env.lancedb"
    monkeypatch.delenv("HAIKU_RAG_DB")
    assert create_capability(config=cfg).db_path == cfg.storage.default_db_path
    # no config: the loaded one (defaults here, as the test env has no config file)
    assert create_capability().db_path is not None


def test_factory_validation_and_options(db: Path, cfg: AppConfig):
    with pytest.raises(ValueError, match="request_limit"):
        create_capability(db, cfg, request_limit=0)
    with pytest.raises(TypeError, match="vision"):
        create_capability(db, cfg, vision="yes")  # type: ignore[arg-type]
    kb = HaikuRAG(db, cfg)
    with pytest.raises(ValueError, match="either db_path or rag"):
        create_capability(db, rag=kb)
    capability = create_capability(db, cfg, vision=True, defer_loading=True)
    assert capability.vision is True and capability.defer_loading is True
    assert capability.id == "haiku_rag" and RAGCapability.get_serialization_name() is None
    borrowed = create_capability(rag=kb)
    assert borrowed.db_path == kb.path and borrowed.config is kb.config


async def test_domain_preamble_is_prepended(db: Path, cfg: AppConfig):
    config = cfg.model_copy(
        update={"prompts": cfg.prompts.model_copy(update={"domain_preamble": "Factory manuals."})}
    )
    script = Script(text("x"))
    await agent_for(script, create_capability(db, config)).run("q", deps=RAGDeps())
    instructions = script.infos[0].instructions or ""
    assert instructions.startswith("Factory manuals.\n\nYou answer from a knowledge base")


async def test_usage_exactly_as_documented(db: Path, cfg: AppConfig, monkeypatch):
    """`Agent(model, capabilities=[rag(db_path=...)])`, config from the environment."""
    from haiku.rag.capabilities.rag import create_capability as rag

    config_file = db.parent / "haiku.rag.yaml"
    config_file.write_text("embeddings:\n  model: hash:v1\n  dimension: 256\n")
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(config_file))
    script = Script(call("search", query="safety"), cite_first(), text("ok"))
    agent = Agent(script.model, capabilities=[rag(db_path=str(db))])
    assert (await agent.run("q")).output == "ok"


async def test_tool_descriptions_are_stable_across_requests(db: Path, cfg: AppConfig):
    script = Script(call("search", query="safety"), call("search", query="pasta"), text("x"))
    await agent_for(script, create_capability(db, cfg)).run("q", deps=RAGDeps())
    schemas = [
        [(t.name, t.description, t.parameters_json_schema) for t in i.function_tools]
        for i in script.infos
    ]
    assert schemas[0] == schemas[1] == schemas[2]


async def test_agent_tool_using_ctx_state_alongside(db: Path, cfg: AppConfig):
    """Tools of the agent can read the same state, e.g. to narrow the search."""

    agent_script = Script(
        call("narrow", pattern="cooking"),
        call("search", query="safety", top_k=10),
        text("x"),
    )
    agent = agent_for(agent_script, create_capability(db, cfg))

    @agent.tool
    def narrow(ctx: RunContext[RAGDeps], pattern: str) -> str:
        ctx.deps.state["rag"].document_filter = pattern
        return "ok"

    deps = RAGDeps()
    await agent.run("q", deps=deps)
    uris = {r.document_uri for r in deps.state["rag"].searches["safety"]}
    assert uris <= {"mem://cooking/pasta.md", "mem://cooking/bread.md"}


# edges --------------------------------------------------------------------------------------


def test_question_of_falls_back_to_history_then_empty():
    from types import SimpleNamespace

    from pydantic_ai.messages import SystemPromptPart, UserPromptPart

    from haiku.rag.capabilities.rag import question_of

    history = [ModelRequest(parts=[UserPromptPart("earlier")]), text("answer")]
    assert question_of(SimpleNamespace(prompt=None, messages=history)) == "earlier"  # type: ignore[arg-type]
    system_only = [ModelRequest(parts=[SystemPromptPart("sys")])]
    assert question_of(SimpleNamespace(prompt=None, messages=system_only)) == ""  # type: ignore[arg-type]
    assert question_of(SimpleNamespace(prompt=["a", "b"], messages=[])) == "a\nb"  # type: ignore[arg-type]


async def test_toolset_releases_only_when_the_last_user_leaves(db: Path, cfg: AppConfig):
    capability = create_capability(db, cfg)
    await capability.client()
    toolset = capability.get_toolset()
    async with toolset:
        async with toolset:
            pass
        assert capability._client is not None  # still entered once
    assert capability._client is None
    with pytest.raises(ValueError, match=r"unknown haiku\.rag tool"):
        await capability.call_tool("nope", None, {})  # type: ignore[arg-type]


async def test_deferred_capability_loaded_from_history(db: Path, cfg: AppConfig, closes):
    capability = create_capability(db, cfg, defer_loading=True)
    load = Script(call("load_capability", id="haiku_rag"), text("loaded"))
    first = await agent_for(load, capability).run("q", deps=RAGDeps())
    later = Script(call("search", query="safety"), text("x"))
    await agent_for(later, capability).run(
        "q2", deps=RAGDeps(), message_history=first.all_messages()
    )
    assert "search" in later.tools(0) and len(closes) == 1


async def test_mounting_is_capped(db: Path, cfg: AppConfig, monkeypatch: pytest.MonkeyPatch):
    from haiku.rag.capabilities import rag as rag_module

    monkeypatch.setattr(rag_module, "MAX_MOUNTED_DOCUMENTS", 1)
    async with HaikuRAG(db, cfg, read_only=True) as kb:
        capability = create_capability(rag=kb)
        everything = await capability._mounted_documents(kb, RAGState())
        chosen = await capability._mounted_documents(kb, RAGState(document_filter="cooking"))
    assert len(everything) == 1 and len(chosen) == 1

    script = Script(
        call("execute_code", code="print(1)"), call("execute_code", code="2"), text("x")
    )
    await agent_for(script, create_capability(db, cfg)).run("q", deps=RAGDeps())
    first, second = last_return(script.seen[1]).content, last_return(script.seen[2]).content
    assert first.startswith(f"Note: 1 of {len(DOCS)} documents are mounted") and "1" in first
    assert "Note:" not in second  # said once

    narrowed = Script(call("execute_code", code="1"), text("x"))
    deps = RAGDeps(state={"rag": RAGState(document_filter="cooking")})
    await agent_for(narrowed, create_capability(db, cfg)).run("q", deps=deps)
    assert last_return(narrowed.seen[1]).content.startswith("Note: 1 of at least 2 documents")


async def test_store_chunks_of_a_vanished_document_do_not_resolve(
    db: Path, cfg: AppConfig, monkeypatch: pytest.MonkeyPatch
):
    async with HaikuRAG(db, cfg, read_only=True) as kb:
        chunk = kb.store.document_chunks(document_id_for("mem://cooking/pasta.md"))[0]
        monkeypatch.setattr(type(kb.store), "get_documents", lambda self, document_ids: [])
        capability = create_capability(rag=kb)
        assert await capability._from_store(RAGState(), [chunk.id]) == {}
