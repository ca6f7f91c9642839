"""The knowledge graph: entities and relationships merged from per-chunk extractions, and the
graph signal that ranks chunks through it.

What is persisted (`Store.save_graph`) is the source of truth, compact and replayable: per
linked chunk its document and content hash, and per content hash the extractor's output
(which doubles as the cache that keeps unchanged chunks from being sent again). The networkx
`MultiDiGraph` is derived from it on load and kept in step incrementally. Every entity
mention and every edge remembers which chunks support it, so removing a document removes
exactly its support, and an entity or edge left without a supporting chunk disappears.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import networkx as nx
from pydantic import TypeAdapter, ValidationError

from haiku.rag.documents import Chunk, document_id_for
from haiku.rag.errors import StoreError
from haiku.rag.progress import NoProgress, Progress
from haiku.rag.retrieval.extract import ChunkExtractor, EntityType, Extraction
from haiku.rag.retrieval.signals import Query
from haiku.rag.store.base import Store

logger = logging.getLogger(__name__)

GRAPH_FORMAT = "haiku.rag.graph"
GRAPH_VERSION = 1
DEFAULT_RELATION = "RELATED_TO"
CHECKPOINT_CHUNKS = 256
"""Extractions between two saves of the cache: bounds the LLM work an interruption loses."""
DESCRIPTIONS_KEPT = 5
"""Distinct descriptions an entity keeps for display and query relevance (most frequent)."""

_STOPWORD_TEXT = """
a an and are as at be been but by can did do does for from had has have how i if in
into is it its me my no not of on or our so than that the their them then there
these they this those to us was we were what when where which who whom whose why
will with would you your about after any all also before between both each more most
other over same some such under until up very via tell show find list give
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
"""Words that never name an entity on their own and carry no relevance."""

T = TypeVar("T")
_TOKEN = re.compile(r"\w+(?:['’.+#&-]\w+)*[+#]*")
_Extractions = TypeAdapter(dict[str, Extraction])


def normalize_name(name: str) -> str:
    """Entities merge by name, ignoring case and whitespace."""
    return " ".join(name.casefold().split())


def tokens(text: str) -> list[str]:
    """Words as the matcher sees them: case-folded, `node.js`/`c++`/`gpt-4` kept whole,
    a possessive `'s` dropped, so names and queries split the same way."""
    words = []
    for word in _TOKEN.findall(text.casefold()):
        words.append(word[:-2] if word.endswith(("'s", "’s")) else word)
    return words


_SUFFIXES = ("ing", "ed", "es", "s")


def _stem(word: str) -> str:
    """A crude suffix fold (headquarters/headquartered, works/worked), for relevance only."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 4 and not word.endswith("ss"):
            return word[: -len(suffix)]
    return word


def _terms(text: str) -> set[str]:
    """Content words for relevance: no stopwords, common suffixes folded."""
    return {_stem(word) for word in tokens(text) if word not in STOPWORDS}


def relation_type(text: str) -> str:
    """`works for` / `Works-For` / `WORKS_FOR` are one relation type."""
    return re.sub(r"\W+", "_", text.strip()).strip("_").upper() or DEFAULT_RELATION


@dataclass(frozen=True)
class Mention:
    """What one chunk says about an entity."""

    name: str
    type: EntityType
    description: str


@dataclass(frozen=True)
class EntityInfo:
    name: str
    type: str
    descriptions: list[str]
    mentions: int
    """Chunks that mention the entity."""
    degree: int
    """Distinct entities it is related to (either direction)."""


@dataclass(frozen=True)
class GraphStats:
    entities: int
    relationships: int
    chunks: int
    documents: int
    top: list[EntityInfo]


@dataclass
class GraphUpdate:
    """What bringing the graph up to date did."""

    extracted: int = 0
    """Chunks the extractor answered for."""
    skipped: int = 0
    """Chunks whose extractor output stayed invalid (warned, not linked)."""
    reused: int = 0
    """Chunks linked from the cache, without a model call."""
    removed_documents: int = 0
    changed: bool = False


def _decrement(counter: Counter[T], value: T) -> None:
    if value in counter:
        counter[value] -= 1
        if counter[value] <= 0:
            del counter[value]


@dataclass
class _Entity:
    """Per-entity support: mentions by chunk, and running counts so updates stay O(1)."""

    mentions: dict[str, Mention] = field(default_factory=dict)
    names: Counter[str] = field(default_factory=Counter)
    types: Counter[EntityType] = field(default_factory=Counter)
    descriptions: Counter[str] = field(default_factory=Counter)
    terms: set[str] | None = None
    mention_terms: dict[str, set[str]] = field(default_factory=dict)

    def add(self, chunk_id: str, mention: Mention) -> None:
        self.mentions[chunk_id] = mention
        self.names[mention.name] += 1
        self.types[mention.type] += 1
        if mention.description:
            self.descriptions[mention.description] += 1
        self.terms = None
        self.mention_terms.pop(chunk_id, None)

    def remove(self, chunk_id: str) -> None:
        mention = self.mentions.pop(chunk_id)
        _decrement(self.names, mention.name)
        _decrement(self.types, mention.type)
        _decrement(self.descriptions, mention.description)
        self.terms = None
        self.mention_terms.pop(chunk_id, None)

    # Ties are broken by value, never by arrival order, so the same chunks give the same
    # entity whatever order they were linked in (drivers list chunks differently).

    @property
    def name(self) -> str:
        """The spelling most chunks use; on a tie, mixed case (`Charles Babbage` over
        `CHARLES BABBAGE`), then the first in sort order."""
        return min(
            self.names.items(),
            key=lambda item: (-item[1], item[0].islower() or item[0].isupper(), item[0]),
        )[0]

    @property
    def type(self) -> EntityType:
        """The most specific type: OTHER only when no chunk said more; among specific
        types the most frequent (on a tie, the first in `EntityType` order)."""
        order = list(EntityType)
        specific = [(t, n) for t, n in self.types.items() if t is not EntityType.OTHER]
        if not specific:
            return EntityType.OTHER
        return min(specific, key=lambda item: (-item[1], order.index(item[0])))[0]

    @property
    def description_list(self) -> list[str]:
        ranked = sorted(self.descriptions.items(), key=lambda item: (-item[1], item[0]))
        return [text for text, _ in ranked[:DESCRIPTIONS_KEPT]]

    def relevance_terms(self) -> set[str]:
        if self.terms is None:
            self.terms = _terms(" ".join([*self.names, *self.description_list]))
        return self.terms

    def chunk_terms(self, chunk_id: str) -> set[str]:
        """What one chunk says about the entity, as relevance terms."""
        terms = self.mention_terms.get(chunk_id)
        if terms is None:
            mention = self.mentions[chunk_id]
            terms = self.mention_terms[chunk_id] = _terms(f"{mention.name} {mention.description}")
        return terms


def _chunk_mentions(
    extraction: Extraction,
) -> tuple[dict[str, Mention], dict[tuple[str, str, str], float]]:
    """One chunk's extraction, merged by normalised name: its mentions and its edges.

    A relationship naming an entity the chunk did not list still makes it a (typeless)
    mention; self-loops and blank names are dropped; weights are clamped to [0, 1].
    """
    mentions: dict[str, Mention] = {}

    def mention(name: str, kind: EntityType, description: str) -> str:
        key = normalize_name(name)
        if not key:
            return key
        seen = mentions.get(key)
        if seen is None:
            mentions[key] = Mention(" ".join(name.split()), kind, description.strip())
        else:  # OTHER is upgraded, never the reverse; the first description stays
            mentions[key] = Mention(
                seen.name,
                kind if seen.type is EntityType.OTHER else seen.type,
                seen.description or description.strip(),
            )
        return key

    for entity in extraction.entities:
        mention(entity.name, entity.type, entity.description)
    edges: dict[tuple[str, str, str], float] = {}
    for relation in extraction.relationships:
        source = mention(relation.source, EntityType.OTHER, "")
        target = mention(relation.target, EntityType.OTHER, "")
        if not source or not target or source == target:
            continue
        edge = (source, target, relation_type(relation.type))
        edges[edge] = max(edges.get(edge, 0.0), min(max(relation.weight, 0.0), 1.0))
    return mentions, edges


class KnowledgeGraph:
    """Entities (nodes, keyed by normalised name) and typed, weighted relationships (edges,
    keyed by relation type) of a knowledge base, with the chunks that support each."""

    def __init__(self) -> None:
        self.graph: nx.MultiDiGraph[str] = nx.MultiDiGraph()
        self.extractions: dict[str, Extraction] = {}
        """Chunk content sha256 -> extractor output: the cache, and the graph's source."""
        self.chunks: dict[str, tuple[str, str]] = {}
        """Linked chunk id -> (document id, content sha256)."""
        self.documents: dict[str, str] = {}
        """Document id -> content sha256 of the version whose chunks were extracted."""
        self._chunk_entities: dict[str, set[str]] = {}
        self._chunk_edges: dict[str, dict[tuple[str, str, str], float]] = {}
        self._by_document: dict[str, set[str]] = {}
        self._index: dict[tuple[str, ...], set[str]] | None = None
        self._longest = 0

    # -- shape -----------------------------------------------------------------

    @property
    def empty(self) -> bool:
        return self.graph.number_of_nodes() == 0

    @property
    def entity_count(self) -> int:
        return int(self.graph.number_of_nodes())

    @property
    def relationship_count(self) -> int:
        return int(self.graph.number_of_edges())

    def entity(self, name: str) -> EntityInfo | None:
        key = normalize_name(name)
        return self._info(key) if key in self.graph else None

    def _info(self, key: str) -> EntityInfo:
        data: _Entity = self.graph.nodes[key]["data"]
        neighbours = set(self.graph.successors(key)) | set(self.graph.predecessors(key))
        return EntityInfo(
            name=data.name,
            type=data.type.value,
            descriptions=data.description_list,
            mentions=len(data.mentions),
            degree=len(neighbours),
        )

    def stats(self, top: int = 10) -> GraphStats:
        """Counts, and the `top` entities by degree, then mentions."""
        infos = [self._info(key) for key in self.graph.nodes]
        infos.sort(key=lambda info: (-info.degree, -info.mentions, info.name.casefold()))
        return GraphStats(
            entities=self.entity_count,
            relationships=self.relationship_count,
            chunks=len(self.chunks),
            documents=len(self.documents),
            top=infos[:top],
        )

    def known_documents(self) -> set[str]:
        """Documents the graph holds anything for (extracted, or partly linked)."""
        return set(self.documents) | set(self._by_document)

    # -- changes ---------------------------------------------------------------

    def link_chunk(self, chunk_id: str, document_id: str, content_hash: str) -> bool:
        """Merge the cached extraction of this content into the graph; False on a cache miss."""
        extraction = self.extractions.get(content_hash)
        if extraction is None:
            return False
        self.unlink_chunk(chunk_id)
        mentions, edges = _chunk_mentions(extraction)
        self.chunks[chunk_id] = (document_id, content_hash)
        self._by_document.setdefault(document_id, set()).add(chunk_id)
        self._chunk_entities[chunk_id] = set(mentions)
        self._chunk_edges[chunk_id] = edges
        for key, mention in mentions.items():
            if key not in self.graph:
                self.graph.add_node(key, data=_Entity())
                self._index = None
            self.graph.nodes[key]["data"].add(chunk_id, mention)
        for (source, target, kind), weight in edges.items():
            if self.graph.has_edge(source, target, key=kind):
                data = self.graph.edges[source, target, kind]
                data["support"][chunk_id] = weight
                data["weight"] = max(data["weight"], weight)
            else:
                self.graph.add_edge(
                    source, target, key=kind, support={chunk_id: weight}, weight=weight
                )
        return True

    def unlink_chunk(self, chunk_id: str) -> None:
        """Withdraw a chunk's support; drop what no chunk supports any more."""
        linked = self.chunks.pop(chunk_id, None)
        if linked is None:
            return
        document_id = linked[0]
        siblings = self._by_document.get(document_id, set())
        siblings.discard(chunk_id)
        if not siblings:
            self._by_document.pop(document_id, None)
        for source, target, kind in self._chunk_edges.pop(chunk_id, {}):
            data = self.graph.edges[source, target, kind]
            removed = data["support"].pop(chunk_id)
            if not data["support"]:
                self.graph.remove_edge(source, target, key=kind)
            elif removed >= data["weight"]:
                data["weight"] = max(data["support"].values())
        for key in self._chunk_entities.pop(chunk_id, set()):
            entity: _Entity = self.graph.nodes[key]["data"]
            entity.remove(chunk_id)
            if not entity.mentions:
                self.graph.remove_node(key)
                self._index = None

    def remove_document(self, document_id: str) -> bool:
        """Forget a document: its chunk links and its extracted-version record."""
        chunk_ids = sorted(self._by_document.get(document_id, ()))
        for chunk_id in chunk_ids:
            self.unlink_chunk(chunk_id)
        return self.documents.pop(document_id, None) is not None or bool(chunk_ids)

    def prune_extractions(self) -> int:
        """Drop cached extractions no linked chunk uses; returns how many."""
        used = {content_hash for _, content_hash in self.chunks.values()}
        stale = [content_hash for content_hash in self.extractions if content_hash not in used]
        for content_hash in stale:
            del self.extractions[content_hash]
        return len(stale)

    # -- persistence -----------------------------------------------------------

    def to_payload(self) -> dict[str, Any]:
        return {
            "format": GRAPH_FORMAT,
            "version": GRAPH_VERSION,
            "documents": dict(self.documents),
            "chunks": {chunk_id: list(link) for chunk_id, link in self.chunks.items()},
            "extractions": {
                content_hash: extraction.model_dump(
                    mode="json", by_alias=True, exclude_defaults=True
                )
                for content_hash, extraction in self.extractions.items()
            },
        }

    @classmethod
    def from_payload(cls, data: Any, origin: str = "the store") -> KnowledgeGraph:
        """Rebuild the graph from a payload. A newer format is an error (upgrade haiku.rag); a
        damaged payload is dropped with a warning, since the next add or rebuild re-extracts."""
        graph = cls()
        if not isinstance(data, dict) or data.get("format") != GRAPH_FORMAT:
            logger.warning(
                "Ignoring the knowledge graph in %s: not a %s payload; the next `add` or "
                "`rebuild` builds it again",
                origin,
                GRAPH_FORMAT,
            )
            return graph
        version = data.get("version")
        if not isinstance(version, int) or version > GRAPH_VERSION:
            raise StoreError(
                f"The knowledge graph in {origin} has format version {version!r}, newer than "
                f"this haiku.rag reads ({GRAPH_VERSION}): upgrade haiku.rag"
            )
        try:
            graph.extractions = _Extractions.validate_python(data.get("extractions") or {})
            documents = dict(data.get("documents") or {})
            links = [
                (str(chunk_id), str(document_id), str(content_hash))
                for chunk_id, (document_id, content_hash) in (data.get("chunks") or {}).items()
            ]
        except (ValidationError, TypeError, ValueError) as error:
            logger.warning(
                "Ignoring the damaged knowledge graph in %s (%s); the next `add` or `rebuild` "
                "builds it again",
                origin,
                str(error).splitlines()[0],
            )
            return cls()
        graph.documents = {str(key): str(value) for key, value in documents.items()}
        for chunk_id, document_id, content_hash in links:
            graph.link_chunk(chunk_id, document_id, content_hash)
        return graph

    # -- query -----------------------------------------------------------------

    def _entity_index(self) -> dict[tuple[str, ...], set[str]]:
        """Token tuple of each entity name -> entities; stopword-only names never match."""
        if self._index is None:
            index: dict[tuple[str, ...], set[str]] = {}
            for key in self.graph.nodes:
                words = tuple(tokens(key))
                if words and not all(word in STOPWORDS for word in words):
                    index.setdefault(words, set()).add(key)
            self._index = index
            self._longest = max(map(len, index), default=0)
        return self._index

    def match(self, query: str) -> list[str]:
        """Entities the query names: whole words for one-word names, the exact word sequence
        for longer ones, case-insensitively. Longest names first, and words already part of
        a match are not matched again: "New York Times" is not also "New York", and "Paris
        Hilton" is not also Paris."""
        index = self._entity_index()
        words = tokens(query)
        taken = [False] * len(words)
        found: set[str] = set()
        for size in range(min(self._longest, len(words)), 0, -1):
            for start in range(len(words) - size + 1):
                if any(taken[start : start + size]):
                    continue
                keys = index.get(tuple(words[start : start + size]))
                if keys:
                    found |= keys
                    taken[start : start + size] = [True] * size
        return sorted(found)

    def _relevance(self, key: str, query_terms: set[str]) -> float:
        """Share of the query's content words found in the entity's name and descriptions."""
        if not query_terms:
            return 0.0
        data: _Entity = self.graph.nodes[key]["data"]
        return len(query_terms & data.relevance_terms()) / len(query_terms)

    def _neighbours(self, key: str) -> dict[str, float]:
        """Neighbours in either direction, with the strongest edge weight to each."""
        best: dict[str, float] = {}
        for _, other, weight in self.graph.out_edges(key, data="weight"):
            best[other] = max(best.get(other, 0.0), weight)
        for other, _, weight in self.graph.in_edges(key, data="weight"):
            best[other] = max(best.get(other, 0.0), weight)
        return best

    def entity_scores(self, query: str, hops: int) -> dict[str, float]:
        """Seeds (entities named in the query) score 1 + relevance; each hop scores a
        neighbour by edge weight x parent score x (1 + relevance) / 2, keeping its best path."""
        seeds = self.match(query)
        if not seeds:
            return {}
        query_terms = _terms(query)
        scores = {key: 1.0 + self._relevance(key, query_terms) for key in seeds}
        frontier = dict(scores)
        for _ in range(hops):
            reached: dict[str, float] = {}
            for key, parent in frontier.items():
                for other, weight in self._neighbours(key).items():
                    score = weight * parent * (1.0 + self._relevance(other, query_terms)) / 2
                    if score > scores.get(other, 0.0) and score > reached.get(other, 0.0):
                        reached[other] = score
            if not reached:
                break
            scores.update(reached)
            frontier = reached
        return scores

    def rank_chunks(
        self,
        query: str,
        *,
        hops: int = 1,
        max_entities: int = 20,
        document_ids: Collection[str] | None = None,
    ) -> list[str]:
        """Chunks linked to the `max_entities` best entities, best first.

        A chunk scores, for each top entity it mentions, the entity's score times
        (1 + the query's relevance to what *this chunk* says about the entity): of the
        many chunks naming a company, the one describing its headquarters answers "where
        is it headquartered". Chunks rank by their best such score, then by the sum.
        """
        scores = self.entity_scores(query, hops)
        top = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:max_entities]
        allowed = None if document_ids is None else set(document_ids)
        query_terms = _terms(query)
        share = 1.0 / len(query_terms) if query_terms else 0.0
        best: dict[str, float] = {}
        total: dict[str, float] = {}
        for key, entity_score in top:
            data: _Entity = self.graph.nodes[key]["data"]
            for chunk_id in data.mentions:
                if allowed is not None and self.chunks[chunk_id][0] not in allowed:
                    continue
                relevance = len(query_terms & data.chunk_terms(chunk_id)) * share
                score = entity_score * (1.0 + relevance)
                best[chunk_id] = max(best.get(chunk_id, 0.0), score)
                total[chunk_id] = total.get(chunk_id, 0.0) + score
        return sorted(best, key=lambda chunk_id: (-best[chunk_id], -total[chunk_id], chunk_id))


class GraphSignal:
    """Chunk ids reached through the entities a query names (the `graph` RRF signal)."""

    name = "graph"
    needs_vector = False

    def __init__(
        self, store: Store, graph: KnowledgeGraph, *, hops: int = 1, max_entities: int = 20
    ) -> None:
        self.store = store
        self.graph = graph
        self.hops = hops
        self.max_entities = max_entities

    async def rank(
        self, query: Query, limit: int, document_ids: Collection[str] | None
    ) -> list[str]:
        # Computed in the event loop, in one go: an add in this process changes the graph
        # only between awaits, so the traversal always sees a consistent graph.
        ranked = self.graph.rank_chunks(
            query.text, hops=self.hops, max_entities=self.max_entities, document_ids=document_ids
        )
        return await self._existing(ranked, limit)

    async def _existing(self, ranked: list[str], limit: int) -> list[str]:
        """The first `limit` ids the store still holds (another process may have deleted some)."""
        kept: list[str] = []
        for start in range(0, len(ranked), limit):
            batch = ranked[start : start + limit]
            found = {chunk.id for chunk in await asyncio.to_thread(self.store.get_chunks, batch)}
            kept.extend(chunk_id for chunk_id in batch if chunk_id in found)
            if len(kept) >= limit:
                break
        return kept[:limit]


# -- keeping the graph in step with the store -----------------------------------


def load_graph(store: Store) -> KnowledgeGraph | None:
    """The store's graph (empty when it has none yet); None when the driver keeps no graph.
    Blocking: call it in a thread."""
    if not store.features.graph:
        return None
    data = store.load_graph()
    return KnowledgeGraph() if data is None else KnowledgeGraph.from_payload(data, store.path)


def _unique_by_content(chunks: Iterable[Chunk], cached: Collection[str]) -> list[Chunk]:
    """One chunk per distinct content not in the cache: identical text is extracted once."""
    seen: set[str] = set()
    todo = []
    for chunk in chunks:
        content_hash = chunk.content_hash
        if content_hash not in cached and content_hash not in seen:
            seen.add(content_hash)
            todo.append(chunk)
    return todo


async def update_graph(
    store: Store,
    graph: KnowledgeGraph,
    extractor: ChunkExtractor | None,
    *,
    full: bool = False,
    progress: Progress | None = None,
) -> GraphUpdate:
    """Bring `graph` in line with the store's documents, then save it.

    Documents the store no longer holds are forgotten. Documents whose content changed since
    their extraction (all of them with `full`, as `rebuild` does) are re-linked: chunks whose
    text is in the cache cost nothing, the rest go to `extractor`. Comparing with the store
    (not with what this call wrote) also repairs an add that was interrupted before its
    extraction finished. Without an extractor, only documents the graph already knows are
    re-linked, from the cache; nothing is sent anywhere.
    """
    progress = progress or NoProgress()
    report = GraphUpdate()
    if extractor is None and not graph.known_documents():
        return report
    hashes = await asyncio.to_thread(store.document_hashes)
    current = {document_id_for(uri): content_hash for uri, content_hash in hashes.items()}
    known = graph.known_documents()
    for document_id in sorted(known - current.keys()):
        graph.remove_document(document_id)
        report.removed_documents += 1
    stale = sorted(
        document_id
        for document_id, content_hash in current.items()
        if (full or graph.documents.get(document_id) != content_hash)
        and (extractor is not None or document_id in known)
    )
    report.changed = bool(report.removed_documents or stale)
    todo = [
        (document_id, await asyncio.to_thread(store.document_chunks, document_id))
        for document_id in stale
    ]
    pending = (
        _unique_by_content((chunk for _, chunks in todo for chunk in chunks), graph.extractions)
        if extractor is not None
        else []
    )

    def keep(chunk: Chunk, extraction: Extraction | None) -> None:
        progress.advance("extraction")
        if extraction is None:
            report.skipped += 1
        else:
            graph.extractions[chunk.content_hash] = extraction
            report.extracted += 1

    if pending:
        assert extractor is not None
        progress.start("extraction", len(pending))
        try:
            for start in range(0, len(pending), CHECKPOINT_CHUNKS):
                if start:  # keep what is done, in case a later batch fails
                    await asyncio.to_thread(store.save_graph, graph.to_payload())
                await extractor.extract(pending[start : start + CHECKPOINT_CHUNKS], keep)
        except BaseException:
            await asyncio.to_thread(store.save_graph, graph.to_payload())
            raise
    for document_id, chunks in todo:
        graph.remove_document(document_id)
        linked = [graph.link_chunk(chunk.id, document_id, chunk.content_hash) for chunk in chunks]
        report.reused += sum(linked)
        if extractor is not None or all(linked):
            graph.documents[document_id] = current[document_id]
    report.reused -= report.extracted  # linked without a model call of their own
    if report.changed:
        graph.prune_extractions()
        await asyncio.to_thread(store.save_graph, graph.to_payload())
    return report
