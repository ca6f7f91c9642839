"""Knowledge graph benchmark: multi-hop retrieval with and without the graph signal, and
extraction throughput with a scripted extractor.

    python bench/graph.py [--people 200] [--embedder hash:v1] [--quick]

No network and no LLM. The benchmark builds its own world: people, the companies they
work for and the cities those companies are headquartered in, one document per person
and per company. A fact needed by a multi-hop question is split across two linked
documents: "Which city is home to the headquarters of the company Orla Venn works
for?" names a person, but the answer lives in the company's document, which never
mentions her. Relevant document = that company's document (known-item metrics, chunk
hits collapsed to documents). Single-hop questions ("Where is Brightwater Dynamics
headquartered?") are the control: the graph should not hurt them.

A scripted extractor (a FunctionModel answering by rules from the passage text) builds
the graph, so the measured throughput is haiku.rag's own cost per chunk (agent run,
validation, merge, checkpointed save), then the same with a simulated model latency at
several concurrency bounds, then re-linking from the cache (`rebuild`: zero calls).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common import table
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from haiku.rag.client import HaikuRAG
from haiku.rag.config import config_from_dict
from haiku.rag.documents import SearchResult
from haiku.rag.retrieval.extract import ChunkExtractor
from haiku.rag.retrieval.graph import KnowledgeGraph, update_graph
from haiku.rag.retrieval.hybrid import HybridRetriever

K = 10
HEAVY_GRAPH_WEIGHT = 2.0
MODES: dict[str, set[str] | None] = {
    "vector": {"vector"},
    "bm25": {"bm25"},
    "graph": {"graph"},
    "hybrid (vector+bm25)": {"vector", "bm25"},
    "hybrid+graph": None,
}

# -- the world -------------------------------------------------------------------------

_WORDS = {
    "syllables": "ka lo ve ri ston mar del fen tor bri an sel vo qui ra mon dex lu pha ner",
    "roles": "engineer chemist designer analyst surveyor architect economist pilot",
    "fields": "physics botany law music geology medicine history statistics",
    "industries": "shipping robotics textiles software mining aerospace biotech retail",
    "products": "turbines sensors fabrics ledgers drills satellites vaccines kiosks",
    "surnames": "Dynamics Holdings Works Labs Systems Partners Industries Collective",
}
SYLLABLES, ROLES, FIELDS, INDUSTRIES, PRODUCTS, SURNAMES = (
    tuple(words.split()) for words in _WORDS.values()
)


def _word(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()


def _unique(rng: random.Random, count: int, make) -> list[str]:  # type: ignore[no-untyped-def]
    seen: set[str] = set()
    names: list[str] = []
    while len(names) < count:
        name = make(rng)
        if name.casefold() not in seen:
            seen.add(name.casefold())
            names.append(name)
    return names


@dataclass(frozen=True)
class Person:
    name: str
    role: str
    company: str
    field: str
    studied_in: str


@dataclass(frozen=True)
class Company:
    name: str
    industry: str
    city: str
    product: str
    founded: int


@dataclass(frozen=True)
class World:
    people: list[Person]
    companies: list[Company]
    documents: dict[str, str]
    """file name -> text"""


def build_world(people: int, seed: int = 7) -> World:
    rng = random.Random(seed)
    cities = _unique(rng, max(10, people // 5), lambda r: _word(r, 2))
    company_names = _unique(
        rng, max(5, people // 2), lambda r: f"{_word(r, 2)} {r.choice(SURNAMES)}"
    )
    person_names = _unique(rng, people, lambda r: f"{_word(r, 2)} {_word(r, 2)}")
    companies = [
        Company(
            name,
            rng.choice(INDUSTRIES),
            rng.choice(cities),
            rng.choice(PRODUCTS),
            rng.randint(1950, 2020),
        )
        for name in company_names
    ]
    staff = [
        Person(
            name,
            rng.choice(ROLES),
            rng.choice(companies).name,
            rng.choice(FIELDS),
            rng.choice(cities),
        )
        for name in person_names
    ]
    documents: dict[str, str] = {}
    for index, person in enumerate(staff):
        documents[f"people/p{index:04d}.md"] = (
            f"# {person.name}\n\n{person.name} is a {person.role} who works for "
            f"{person.company}. {person.name} studied {person.field} in {person.studied_in} "
            f"before joining, and colleagues describe the work as careful and thorough.\n"
        )
    for index, company in enumerate(companies):
        documents[f"companies/c{index:04d}.md"] = (
            f"# {company.name}\n\n{company.name} is a {company.industry} company with its "
            f"headquarters in {company.city}. Founded in {company.founded}, it makes "
            f"{company.product} for customers in many countries.\n"
        )
    return World(staff, companies, documents)


# -- the scripted extractor ------------------------------------------------------------

PERSON_FACT = re.compile(
    r"(?P<person>[A-Z]\w+ [A-Z]\w+) is an? (?P<role>\w+) who works for (?P<company>[A-Z]\w+ "
    r"[A-Z]\w+)\. (?P=person) studied (?P<field>\w+) in (?P<city>[A-Z]\w+)"
)
COMPANY_FACT = re.compile(
    r"(?P<company>[A-Z]\w+ [A-Z]\w+) is an? (?P<industry>\w+) company with its headquarters "
    r"in (?P<city>[A-Z]\w+)"
)


def _prompt(messages: list[ModelMessage]) -> str:
    for message in messages:
        for part in getattr(message, "parts", []):
            if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                return part.content
    return ""


def scripted_extraction(text: str) -> dict[str, list[dict[str, object]]]:
    """What a good extractor would return for the benchmark's two document templates."""
    if match := PERSON_FACT.search(text):
        person, company, city = match["person"], match["company"], match["city"]
        return {
            "entities": [
                {"name": person, "type": "PERSON", "description": f"A {match['role']}."},
                {"name": company, "type": "ORGANIZATION", "description": "An employer."},
                {"name": city, "type": "LOCATION", "description": f"Where {person} studied."},
            ],
            "relationships": [
                {"from": person, "to": company, "type": "WORKS_FOR", "weight": 0.9},
                {"from": person, "to": city, "type": "STUDIED_IN", "weight": 0.6},
            ],
        }
    if match := COMPANY_FACT.search(text):
        company, city = match["company"], match["city"]
        return {
            "entities": [
                {
                    "name": company,
                    "type": "ORGANIZATION",
                    "description": f"A {match['industry']} company headquartered in {city}.",
                },
                {"name": city, "type": "LOCATION", "description": f"Home of {company}."},
            ],
            "relationships": [
                {"from": company, "to": city, "type": "HEADQUARTERED_IN", "weight": 0.9}
            ],
        }
    return {"entities": [], "relationships": []}


class Scripted:
    """The FunctionModel body: answers by rules, after `latency` seconds (a model's think time)."""

    def __init__(self, latency: float = 0.0) -> None:
        self.latency = latency
        self.calls = 0

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        if self.latency:
            await asyncio.sleep(self.latency)
        args = scripted_extraction(_prompt(messages))
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args)])


# -- metrics ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Scores:
    recall5: float
    mrr: float
    ndcg: float


def document_ranking(results: Sequence[SearchResult]) -> list[str]:
    ranking: list[str] = []
    for result in results:
        if result.document_uri not in ranking:
            ranking.append(result.document_uri)
    return ranking[:K]


def score(rankings: Sequence[list[str]], relevant: Sequence[str]) -> Scores:
    recall = mrr = ndcg = 0.0
    for ranking, target in zip(rankings, relevant, strict=True):
        if target in ranking:
            position = ranking.index(target) + 1
            recall += position <= 5
            mrr += 1 / position
            ndcg += 1 / math.log2(position + 1)
    n = len(relevant) or 1
    return Scores(recall / n, mrr / n, ndcg / n)


# -- the runs --------------------------------------------------------------------------


async def retrieval(world: World, root: Path, embedder: str, queries: int) -> str:
    corpus = root / "corpus"
    for name, text in world.documents.items():
        (corpus / name).parent.mkdir(parents=True, exist_ok=True)
        (corpus / name).write_text(text, encoding="utf-8")
    uri = {name: (corpus / name).resolve().as_uri() for name in world.documents}
    company_doc = {
        company.name: uri[f"companies/c{index:04d}.md"]
        for index, company in enumerate(world.companies)
    }
    rng = random.Random(11)
    multi = [
        (
            f"Which city is home to the headquarters of the company {person.name} works for?",
            company_doc[person.company],
        )
        for person in rng.sample(world.people, min(queries, len(world.people)))
    ]
    single = [
        (f"Where is {company.name} headquartered?", company_doc[company.name])
        for company in rng.sample(world.companies, min(queries // 2, len(world.companies)))
    ]
    config = config_from_dict({"embeddings": {"model": embedder}, "search": {"top_k": K}})
    async with HaikuRAG(root / "kb.lancedb", config, create=True) as kb:
        kb.extractor = ChunkExtractor(FunctionModel(Scripted()), concurrency=8)
        started = time.perf_counter()
        report = await kb.add(str(corpus))
        add_seconds = time.perf_counter() - started
        stats = await kb.graph_stats()
        assert stats is not None
        rows = []
        latency: dict[str, list[float]] = {}
        # The default weights (graph 0.9), then a heavier graph weight for comparison.
        heavy = HybridRetriever(
            kb.store,
            kb.embedder,
            kb.config.search.model_copy(update={"graph_weight": HEAVY_GRAPH_WEIGHT}),
            signals=kb.retriever.signals,
        )
        runs = [(mode, kb.retriever, signals) for mode, signals in MODES.items()]
        runs.append((f"hybrid+graph, graph_weight {HEAVY_GRAPH_WEIGHT}", heavy, None))
        for label, questions in (("multi-hop", multi), ("single-hop", single)):
            for mode, retriever, signals in runs:
                rankings = []
                for question, _ in questions:
                    began = time.perf_counter()
                    results = await retriever.search(question, top_k=K, signals=signals)
                    latency.setdefault(mode, []).append((time.perf_counter() - began) * 1000)
                    rankings.append(document_ranking(results))
                scores = score(rankings, [target for _, target in questions])
                rows.append((label, mode, len(questions), scores.recall5, scores.mrr, scores.ndcg))
    quality = table(
        f"Multi-hop retrieval: {len(world.people)} people + {len(world.companies)} companies "
        f"({report.chunks_embedded} chunks; graph {stats.entities} entities, "
        f"{stats.relationships} relationships), embedder {embedder}",
        ("questions", "signals", "n", "Recall@5", "MRR@10", "nDCG@10"),
        rows,
    )
    speed = table(
        f"Search latency over both question sets (add with extraction: {add_seconds:.1f} s)",
        ("signals", "p50 ms", "p95 ms"),
        [
            (mode, statistics.median(ms), statistics.quantiles(ms, n=20)[-1])
            for mode, ms in latency.items()
        ],
    )
    return quality + "\n" + speed


async def throughput(root: Path) -> str:
    """Extraction throughput over the store built by `retrieval` (its chunks, fresh graphs)."""
    rows = []
    async with HaikuRAG(root / "kb.lancedb", read_only=False) as kb:
        store = kb.store
        chunks = await asyncio.to_thread(store.count_chunks)
        for latency, concurrency in ((0.0, 1), (0.0, 4), (0.02, 1), (0.02, 4), (0.02, 16)):
            model = Scripted(latency)
            extractor = ChunkExtractor(FunctionModel(model), concurrency=concurrency)
            graph = KnowledgeGraph()
            began = time.perf_counter()
            update = await update_graph(store, graph, extractor)
            seconds = time.perf_counter() - began
            rows.append(
                (f"{latency * 1000:.0f} ms", concurrency, update.extracted, model.calls, seconds,
                 update.extracted / seconds)
            )  # fmt: skip
        # Re-linking everything from the cache, as `rebuild` does: no model call.
        model = Scripted()
        began = time.perf_counter()
        update = await update_graph(store, graph, ChunkExtractor(FunctionModel(model)), full=True)
        seconds = time.perf_counter() - began
        rows.append(("cache (rebuild)", "-", update.reused, model.calls, seconds, chunks / seconds))
    return table(
        f"Extraction throughput, scripted extractor ({chunks} chunks; each run builds a graph "
        "from scratch and saves it)",
        ("model latency", "concurrency", "chunks extracted", "model calls", "seconds", "chunks/s"),
        rows,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, default=200)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--embedder", default="hash:v1")
    parser.add_argument("--quick", action="store_true", help="60 people, 30 questions")
    args = parser.parse_args()
    people, queries = (60, 30) if args.quick else (args.people, args.queries)
    world = build_world(people)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(await retrieval(world, root, args.embedder, queries))
        print(await throughput(root))
    sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
