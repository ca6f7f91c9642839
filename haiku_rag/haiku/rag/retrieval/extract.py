"""Entity and relationship extraction: one structured-output LLM call per chunk.

The extractor is any Pydantic AI chat model. Its output is validated against
`Extraction` (the same JSON structure for the default and a custom prompt), so
the graph only ever merges well-formed data. Invalid output is retried by the
agent, then the chunk is skipped with a warning: one bad chunk must not stop an
ingest. Transient provider failures (rate limits, 5xx, timeouts) are retried
with backoff; anything else (bad API key, unknown model) stops the extraction
with one clear error, since every other chunk would fail the same way.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_ai import Agent
from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelContextWindowExceededError,
    ModelHTTPError,
    ModelQuotaExceededError,
    ModelRequestRejectedError,
    UnexpectedModelBehavior,
)
from pydantic_ai.framing import register_tag, wrap
from pydantic_ai.models import Model

from haiku.rag.config import GRAPH_CHUNK_PLACEHOLDER, GraphConfig
from haiku.rag.documents import Chunk
from haiku.rag.errors import ExtractionError

logger = logging.getLogger(__name__)


class EntityType(StrEnum):
    PERSON = "PERSON"
    ORGANIZATION = "ORGANIZATION"
    CONCEPT = "CONCEPT"
    TECHNOLOGY = "TECHNOLOGY"
    LOCATION = "LOCATION"
    EVENT = "EVENT"
    OTHER = "OTHER"


class ExtractedEntity(BaseModel):
    """A named thing the chunk talks about."""

    name: str = Field(min_length=1, description="The entity's name, as written in the text.")
    type: EntityType = Field(EntityType.OTHER, description="The kind of entity.")
    description: str = Field("", description="One sentence on what the text says about it.")

    @field_validator("type", mode="before")
    @classmethod
    def _lenient_type(cls, value: Any) -> Any:
        """Models vary the case or invent types; an unknown type is still an entity."""
        if isinstance(value, str):
            upper = value.strip().upper()
            return upper if upper in EntityType.__members__ else EntityType.OTHER
        return value


class ExtractedRelationship(BaseModel):
    """A directed, typed link between two entities of the same chunk."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    source: str = Field(alias="from", min_length=1, description="Name of the source entity.")
    target: str = Field(alias="to", min_length=1, description="Name of the target entity.")
    type: str = Field("RELATED_TO", description="Short verb phrase, e.g. WORKS_FOR, PART_OF.")
    weight: float = Field(1.0, description="How strongly the text states it, 0 to 1.")

    @field_validator("weight", mode="after")
    @classmethod
    def _clamp(cls, weight: float) -> float:
        """Out-of-range weights are a scale slip, not garbage: clamp them into [0, 1]."""
        if math.isnan(weight):
            raise ValueError("weight must be a number between 0 and 1")
        return min(max(weight, 0.0), 1.0)


class Extraction(BaseModel):
    """What one chunk yields: the extractor's structured output, and the cache entry."""

    entities: list[ExtractedEntity] = Field(default_factory=list)
    relationships: list[ExtractedRelationship] = Field(default_factory=list)


DEFAULT_INSTRUCTIONS = """\
You build a knowledge graph from passages of a document collection.
List the entities the passage names: people, organizations, concepts, technologies,
locations and events. Use each entity's full, canonical name as written (not a pronoun),
its type (PERSON, ORGANIZATION, CONCEPT, TECHNOLOGY, LOCATION, EVENT or OTHER) and one
sentence saying what the passage tells about it.
List the relationships the passage states between those entities: `from` and `to` are
entity names exactly as listed, `type` a short UPPER_SNAKE_CASE verb phrase (WORKS_FOR,
FOUNDED, PART_OF, USES, LOCATED_IN...), `weight` from 0 to 1 for how explicitly the
passage states it. Extract only what the passage says; empty lists are a valid answer."""


Sleep = Callable[[float], Awaitable[Any]]
PASSAGE_TAG = register_tag("passage")


def _is_transient(error: Exception) -> bool:
    """Worth retrying after a pause: rate limits, overload, 5xx, timeouts, dropped connections."""
    if isinstance(error, ModelRequestRejectedError | ModelQuotaExceededError):
        return False
    if isinstance(error, ModelHTTPError):
        return error.status_code in {408, 409, 425, 429} or error.status_code >= 500
    return isinstance(error, ModelAPIError | TimeoutError | ConnectionError)


def _describe(chunk: Chunk) -> str:
    return f"chunk {chunk.id} (#{chunk.order} of document {chunk.document_id})"


class ChunkExtractor:
    """Sends chunks to a chat model, a bounded number at a time, and returns validated output.

    `model` is a Pydantic AI model or `provider:name`; the agent is built on first use so
    opening a knowledge base never needs the provider's API key.
    """

    def __init__(
        self,
        model: Model | str,
        *,
        prompt: str | None = None,
        concurrency: int = 4,
        max_retries: int = 2,
        retry_base_delay: float = 1.0,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if prompt is not None and GRAPH_CHUNK_PLACEHOLDER not in prompt:
            raise ValueError(f"The extraction prompt must contain {GRAPH_CHUNK_PLACEHOLDER}")
        if concurrency <= 0:
            raise ValueError(f"concurrency must be positive, got {concurrency}")
        self.model = model
        self.prompt = prompt
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.retry_base_delay = retry_base_delay
        self.sleep = sleep
        self._agent: Agent[None, Extraction] | None = None

    @classmethod
    def from_config(cls, config: GraphConfig) -> ChunkExtractor | None:
        """The configured extractor, or None when no extractor model is set."""
        if config.extractor_model is None:
            return None
        return cls(
            config.extractor_model,
            prompt=config.extractor_prompt,
            concurrency=config.concurrency,
            max_retries=config.max_retries,
        )

    @property
    def model_name(self) -> str:
        return self.model if isinstance(self.model, str) else self.model.model_name

    @property
    def agent(self) -> Agent[None, Extraction]:
        if self._agent is None:
            try:
                self._agent = Agent(
                    self.model,
                    output_type=Extraction,
                    # A custom prompt is the whole request; the output schema still applies.
                    instructions=None if self.prompt else DEFAULT_INSTRUCTIONS,
                    retries={"output": self.max_retries},
                    name="haiku.rag.extractor",
                )
            except Exception as error:
                raise ExtractionError(
                    f"Cannot use graph.extractor_model {self.model_name!r}: {error}"
                ) from error
        return self._agent

    def render(self, text: str) -> str:
        """The request for one chunk: the custom prompt with the text in place of
        `__CHUNK__`, or the text framed as a passage (so it cannot pose as instructions)."""
        if self.prompt is not None:
            return self.prompt.replace(GRAPH_CHUNK_PLACEHOLDER, text)
        return "Extract the knowledge graph of this passage.\n\n" + wrap(PASSAGE_TAG, text)

    async def extract_chunk(self, chunk: Chunk) -> Extraction | None:
        """The chunk's entities and relationships; None (with a warning) when the model's
        output stays invalid after retries. Raises ExtractionError when the provider fails."""
        agent = self.agent
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                await self.sleep(self.retry_base_delay * 2 ** (attempt - 1))
            try:
                result = await agent.run(self.render(chunk.content))
            except (UnexpectedModelBehavior, ModelContextWindowExceededError) as error:
                logger.warning(
                    "Graph extraction skipped %s: the model's output stayed invalid (%s)",
                    _describe(chunk),
                    str(error).splitlines()[0],
                )
                return None
            except Exception as error:
                if not _is_transient(error):
                    raise ExtractionError(
                        f"Graph extractor {self.model_name!r} failed on {_describe(chunk)}: "
                        f"{type(error).__name__}: {error}; check graph.extractor_model and "
                        "the provider's credentials"
                    ) from error
                last = error
                continue
            return result.output
        raise ExtractionError(
            f"Graph extractor {self.model_name!r} failed on {_describe(chunk)} after "
            f"{self.max_retries + 1} attempt(s): {type(last).__name__}: {last}; documents "
            "were stored, and the next `add` extracts the missing chunks"
        ) from last

    async def extract(
        self,
        chunks: Sequence[Chunk],
        on_result: Callable[[Chunk, Extraction | None], None] | None = None,
    ) -> dict[str, Extraction | None]:
        """Extract `chunks` with at most `concurrency` calls in flight.

        `on_result` sees each result as it arrives (so a caller can keep what finished if a
        later chunk fails). The first ExtractionError cancels the calls still running.
        """
        gate = asyncio.Semaphore(self.concurrency)
        results: dict[str, Extraction | None] = {}

        async def one(chunk: Chunk) -> None:
            async with gate:
                extraction = await self.extract_chunk(chunk)
            results[chunk.id] = extraction
            if on_result is not None:
                on_result(chunk, extraction)

        tasks = [asyncio.ensure_future(one(chunk)) for chunk in chunks]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return results
