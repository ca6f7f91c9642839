"""Capability overhead: what the RAG capability adds to each model request, and what an
`execute_code` round trip costs.

    python bench/capability.py [--runs 20] [--requests 10] [--calls 20]

No network and no LLM: a FunctionModel plays the model, the store uses the
deterministic `hash:v1` embedder. Rows:

- per-request overhead: an agent run of `--requests` model requests (the model calls
  a trivial agent tool, then answers), without the capability, with a borrowed
  client (`rag=`), and with the capability's own client (opened and closed per run);
  reported as ms per request and the difference to the bare agent.
- execute_code: the first call of a run (starts the Monty worker and mounts the
  documents) and the steady-state round trip (median), both as the model sees them:
  from its tool call to the next request.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from haiku.rag.capabilities.rag import create_capability
from haiku.rag.capabilities.state import RAGDeps
from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig, config_from_dict

DOCUMENTS = 20


def noop() -> str:
    """A trivial agent tool, so requests cost the agent loop and nothing else."""
    return "ok"


def looping_model(requests: int, tool: str, args: dict[str, Any]) -> Callable[[], FunctionModel]:
    """A model that calls `tool` on every request but the last, then answers."""

    def build() -> FunctionModel:
        count = 0

        def run(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            nonlocal count
            count += 1
            if count < requests:
                return ModelResponse(parts=[ToolCallPart(tool, dict(args))])
            return ModelResponse(parts=[TextPart("done")])

        return FunctionModel(run)

    return build


async def time_runs(
    agents: dict[str, Agent[Any, str]], model: Callable[[], FunctionModel], runs: int
) -> dict[str, float]:
    """Median seconds per run for each agent; runs are interleaved so load on the machine
    hits every row alike (agents are built once, as an application would)."""
    samples: dict[str, list[float]] = {name: [] for name in agents}
    for round_ in range(runs + 1):
        for name, agent in agents.items():
            start = time.perf_counter()
            await agent.run("What is in the documents?", deps=RAGDeps(), model=model())
            if round_:  # the first round warms caches up
                samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


async def request_overhead(
    path: Path, config: AppConfig, runs: int, requests: int
) -> list[tuple[str, float]]:
    model = looping_model(requests, "noop", {})
    async with HaikuRAG(path, config, read_only=True) as kb:
        agents = {
            "agent without the capability": Agent(model(), tools=[noop]),
            "+ capability, borrowed client": Agent(
                model(), tools=[noop], capabilities=[create_capability(rag=kb)]
            ),
            "+ capability, own client (open/close per run)": Agent(
                model(), tools=[noop], capabilities=[create_capability(path, config)]
            ),
        }
        seconds = await time_runs(agents, model, runs)
    return [(name, value * 1000 / requests) for name, value in seconds.items()]


async def execute_code_round_trips(path: Path, config: AppConfig, calls: int) -> dict[str, float]:
    """Times from the model's execute_code call to the next request, within one run."""
    stamps: list[float] = []
    count = 0

    def run(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal count
        stamps.append(time.perf_counter())
        count += 1
        if count <= calls:
            return ModelResponse(parts=[ToolCallPart("execute_code", {"code": "x = 1\nx + 1"})])
        return ModelResponse(parts=[TextPart("done")])

    limits = config.qa.model_copy(update={"max_executions": calls + 1})
    budgeted = config.model_copy(update={"qa": limits})
    async with HaikuRAG(path, budgeted, read_only=True) as kb:
        capability = create_capability(rag=kb, request_limit=calls + 2)
        await Agent(FunctionModel(run), capabilities=[capability]).run("q", deps=RAGDeps())
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]
    return {
        "first call (worker start + mount)": gaps[0],
        "steady state (median)": statistics.median(gaps[1:]),
        "steady state (p90)": sorted(gaps[1:])[int(0.9 * (len(gaps) - 2))],
    }


async def build_store(root: Path) -> tuple[Path, AppConfig]:
    config = config_from_dict(
        {
            "embeddings": {"model": "hash:v1", "dimension": 256},
            "storage": {"data_dir": str(root / "data")},
        }
    )
    path = root / "bench.lancedb"
    async with HaikuRAG(path, config, create=True) as kb:
        for i in range(DOCUMENTS):
            text = f"# Document {i}\n\n" + " ".join(f"word{i}_{j}" for j in range(300))
            await kb.add_text(text, uri=f"mem://bench/{i}.md", title=f"Document {i}")
    return path, config


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per row (median)")
    parser.add_argument("--requests", type=int, default=10, help="model requests per run")
    parser.add_argument("--calls", type=int, default=20, help="execute_code calls")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path, config = await build_store(Path(tmp))
        overhead = await request_overhead(path, config, args.runs, args.requests)
        sandbox = await execute_code_round_trips(path, config, args.calls)

    base = overhead[0][1]
    print(f"\nPer-request overhead ({args.requests} requests per run, median of {args.runs} runs)")
    print(f"{'setup':<48} {'ms/request':>11} {'added':>9}")
    for name, ms in overhead:
        print(f"{name:<48} {ms:>11.3f} {ms - base:>+9.3f}")
    print(f"\nexecute_code round trip ({args.calls} calls, {DOCUMENTS} documents mounted)")
    print(f"{'call':<48} {'ms':>11}")
    for name, ms in sandbox.items():
        print(f"{name:<48} {ms:>11.2f}")


if __name__ == "__main__":
    asyncio.run(main())
