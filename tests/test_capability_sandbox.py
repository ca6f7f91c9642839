"""`execute_code` through a real Agent: the Monty sandbox over the question's documents."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from haiku.rag.capabilities.ledger import citation_status
from haiku.rag.capabilities.rag import create_capability
from haiku.rag.capabilities.state import RAGDeps, RAGState
from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig, config_from_dict
from haiku.rag.documents import document_id_for

SAFETY = "mem://manuals/safety.md"
PASTA = "mem://cooking/pasta.md"
DOCS = {
    SAFETY: ("Safety manual", "Operators wear a hard hat and steel-toe boots on the floor."),
    PASTA: ("Pasta", "Boil salted water, add the spaghetti and cook for nine minutes."),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, AppConfig]:
    tmp = tmp_path_factory.mktemp("kb")
    config = config_from_dict(
        {
            "embeddings": {"model": "hash:v1", "dimension": 256},
            "storage": {"data_dir": str(tmp / "data")},
            "sandbox": {"code_timeout": 1.0, "max_output_chars": 400},
            "qa": {"max_executions": 4},
        }
    )
    path = tmp / "kb.lancedb"

    async def build() -> None:
        async with HaikuRAG(path, config, create=True) as kb:
            for uri, (title, body) in DOCS.items():
                await kb.add_text(body, uri=uri, title=title, metadata={"kind": "manual"})

    asyncio.run(build())
    return path, config


def call(tool: str, **args: Any) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool, args)])


def code(source: str) -> ModelResponse:
    return call("execute_code", code=source)


class Script:
    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.seen: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        index = len(self.seen) - 1
        step = self.steps[index] if index < len(self.steps) else ModelResponse([TextPart("ok")])
        return step(messages) if callable(step) else step

    def returned(self, index: int) -> ToolReturnPart:
        """The tool return the model saw at request `index`."""
        request = self.seen[index][-1]
        assert isinstance(request, ModelRequest)
        part = request.parts[0]
        assert isinstance(part, ToolReturnPart)
        return part


async def run(
    store: tuple[Path, AppConfig], script: Script, deps: RAGDeps | None = None, **kw: Any
) -> RAGDeps:
    path, config = store
    deps = deps or RAGDeps()
    agent = Agent(FunctionModel(script), capabilities=[create_capability(path, config, **kw)])
    await agent.run("What do operators wear?", deps=deps)
    return deps


async def test_code_reads_documents_searches_and_the_find_is_citable(store):
    safety_id = document_id_for(SAFETY)

    def cite_found(messages: list[ModelMessage]) -> ModelResponse:
        request = messages[-1]
        assert isinstance(request, ModelRequest)
        part = request.parts[0]
        assert isinstance(part, ToolReturnPart)
        return call("cite", chunk_ids=part.metadata["chunk_ids"][:1])

    script = Script(
        code(
            f"text = open('{safety_id}/content.txt').read()\n"
            "print(text.split()[0])\n"
            "rows = await search('hard hat boots')\n"
            "print(rows[0]['document_uri'], rows[0]['chunk_meta'], rows[0]['picture_refs'])\n"
            "len(rows)"
        ),
        cite_found,
        ModelResponse([TextPart("Hard hats [1].")]),
    )
    deps = await run(store, script)
    output = script.returned(1)
    assert output.outcome != "failed", output.content
    assert output.content.startswith("Operators\nmem://manuals/safety.md {")
    assert "'picture_refs'" not in output.content and "[]" in output.content
    assert "Citable chunk ids found by search()" in output.content
    state: RAGState = deps.state["rag"]
    assert "[code] hard hat boots" in state.searches
    assert citation_status(state.evidence) == "grounded"
    cited = state.citation_index[state.citations[0]]
    assert cited.document_uri == SAFETY
    entry = state.executions[0]
    assert entry.found_chunk_ids and entry.error is None and not entry.timed_out
    assert state.search_calls == 0  # code searches are not budgeted
    assert state.evidence.current().events[0].tool == "execute_code"  # type: ignore[union-attr]


async def test_metadata_list_documents_and_chunks(store):
    safety_id = document_id_for(SAFETY)
    script = Script(
        code(
            "import json\n"
            f"meta = json.loads(open('/documents/{safety_id}/metadata.json').read())\n"
            f"first = json.loads(open('{safety_id}/chunks.jsonl').read().splitlines()[0])\n"
            "docs = await list_documents()\n"
            "print(meta['uri'], meta['metadata'], sorted(first))\n"
            "sorted(d['uri'] for d in docs), docs[0]['metadata']"
        )
    )
    await run(store, script)
    output = script.returned(1).content
    assert "mem://manuals/safety.md {'kind': 'manual'}" in output
    assert "'chunk_id'" in output and "'content'" in output
    assert "['mem://cooking/pasta.md', 'mem://manuals/safety.md']" in output


async def test_only_the_questions_documents_are_mounted(store):
    script = Script(code("import os\nsorted(os.listdir('/documents'))"))
    await run(store, script, deps=RAGDeps(state={"rag": RAGState(sources=[PASTA])}))
    assert script.returned(1).content == repr([document_id_for(PASTA)])


async def test_writes_and_reads_outside_documents_fail_and_the_run_goes_on(store):
    safety_id = document_id_for(SAFETY)
    script = Script(
        code(f"open('/documents/{safety_id}/new.txt', 'w').write('x')"),
        code("open('/etc/passwd').read()"),
        code("print('still here')"),
    )
    await run(store, script)
    write, read, alive = script.returned(1), script.returned(2), script.returned(3)
    assert write.outcome == "failed" and "PermissionError" in write.content
    assert read.outcome == "failed"
    assert "FileNotFoundError" in read.content or "PermissionError" in read.content
    assert alive.outcome != "failed" and alive.content.startswith("still here")


async def test_python_errors_come_back_as_tool_failures_with_output(store):
    script = Script(code("print('before')\n1 / 0"))
    deps = await run(store, script)
    failed = script.returned(1)
    assert failed.outcome == "failed"
    assert failed.content.startswith("before") and "ZeroDivisionError" in failed.content
    assert deps.state["rag"].executions[0].error


async def test_timeout_then_a_fresh_namespace(store):
    script = Script(
        code("x = 41"),
        code("x + 1"),
        code("while True:\n    pass"),
        code("try:\n    x\nexcept NameError:\n    print('fresh')"),
    )
    deps = await run(store, script)
    assert script.returned(2).content.startswith("42")  # variables persist between calls
    stopped = script.returned(3)
    assert stopped.outcome == "failed" and "sandbox.code_timeout" in stopped.content
    fresh = script.returned(4)
    assert fresh.outcome != "failed"
    assert "restarted" in fresh.content and "fresh" in fresh.content
    entries = deps.state["rag"].executions
    assert entries[2].timed_out and entries[3].restarted


async def test_output_is_capped_and_empty_output_is_said(store):
    script = Script(code("print('y' * 5000)"), code("z = 1"))
    await run(store, script)
    assert "[output truncated:" in script.returned(1).content
    assert script.returned(2).content == "(no output)"


async def test_max_executions_spent(store):
    script = Script(*(code(str(i)) for i in range(5)), ModelResponse([TextPart("ok")]))
    seen_instructions: list[str] = []

    def capture(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen_instructions.append(info.instructions or "")
        return script(messages, info)

    path, config = store
    agent = Agent(FunctionModel(capture), capabilities=[create_capability(path, config)])
    await agent.run("q", deps=RAGDeps())
    failed = script.returned(5)
    assert failed.outcome == "failed" and "qa.max_executions" in failed.content
    assert "`execute_code` budget of this question is spent" in seen_instructions[4]
    assert "`execute_code` budget" not in seen_instructions[3]


async def test_sandbox_is_closed_at_run_end(store, monkeypatch: pytest.MonkeyPatch):
    from haiku.rag import sandbox as sandbox_module

    closed: list[object] = []
    original = sandbox_module.Sandbox.aclose

    async def spy(self: Any) -> None:
        closed.append(self)
        await original(self)

    monkeypatch.setattr(sandbox_module.Sandbox, "aclose", spy)
    await run(store, Script(code("1"), code("2")))
    assert len(closed) == 1
