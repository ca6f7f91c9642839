"""The chunk extractor: prompts, structured output, retries, concurrency, config validation."""

from __future__ import annotations

import asyncio
import json
import logging
import math

import pytest
from graph_support import MALFORMED, ScriptedExtractor, entity, prompt_text, relation
from pydantic import ValidationError
from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelAuthenticationError,
    ModelContextWindowExceededError,
    ModelHTTPError,
    ModelQuotaExceededError,
    ModelRateLimitError,
    UserError,
)
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from haiku.rag.config import GraphConfig, config_from_dict
from haiku.rag.documents import Chunk
from haiku.rag.errors import ConfigError, ExtractionError
from haiku.rag.retrieval.extract import (
    DEFAULT_INSTRUCTIONS,
    ChunkExtractor,
    EntityType,
    Extraction,
    _is_transient,
)

ADA = {
    "entities": [entity("Ada Lovelace", "person", "Wrote the first algorithm.")],
    "relationships": [relation("Ada Lovelace", "Charles Babbage", "WORKED_WITH", 0.9)],
}


def chunk(text: str, order: int = 0) -> Chunk:
    return Chunk(id=f"c{order}", document_id="d1", order=order, content=text)


class NoSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


async def test_default_prompt_frames_the_chunk_and_returns_validated_output() -> None:
    seen: list[AgentInfo] = []
    scripted = ScriptedExtractor({"Ada": ADA})

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        return scripted(messages, info)

    extractor = ChunkExtractor(FunctionModel(model))
    result = await extractor.extract_chunk(chunk("Ada Lovelace met Babbage. </passage>"))
    assert result is not None
    assert result.entities[0].type is EntityType.PERSON
    assert result.relationships[0].source == "Ada Lovelace"
    assert seen[0].instructions == DEFAULT_INSTRUCTIONS
    assert '"from"' in json.dumps(seen[0].output_tools[0].parameters_json_schema)
    prompt = scripted.prompts[0]
    assert "<passage>Ada Lovelace met Babbage. &lt;/passage></passage>" in prompt
    assert extractor.model_name.startswith("function:")
    assert ChunkExtractor("openai:gpt-5-mini").model_name == "openai:gpt-5-mini"


async def test_a_custom_prompt_replaces_the_request() -> None:
    config = config_from_dict(
        {"graph": {"extractor_model": "test", "extractor_prompt": "Graph of: __CHUNK__ (json)"}}
    )
    extractor = ChunkExtractor.from_config(config.graph)
    assert extractor is not None
    assert (extractor.model, extractor.concurrency, extractor.max_retries) == ("test", 4, 2)
    scripted = ScriptedExtractor({"Ada": ADA})
    infos: list[AgentInfo] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        infos.append(info)
        return scripted(messages, info)

    extractor.model = FunctionModel(model)
    await extractor.extract_chunk(chunk("Ada Lovelace"))
    assert scripted.prompts == ["Graph of: Ada Lovelace (json)"]
    assert infos[0].instructions is None
    assert ChunkExtractor.from_config(GraphConfig()) is None


def test_a_prompt_without_the_placeholder_is_rejected() -> None:
    with pytest.raises(ConfigError) as error:
        config_from_dict({"graph": {"extractor_prompt": "Extract entities from the text."}})
    message = str(error.value)
    assert "graph.extractor_prompt" in message and "__CHUNK__" in message
    with pytest.raises(ValueError, match="__CHUNK__"):
        ChunkExtractor("test", prompt="no placeholder")
    with pytest.raises(ValueError, match="concurrency"):
        ChunkExtractor("test", concurrency=0)
    with pytest.raises(ConfigError, match=r"graph\.hops"):
        config_from_dict({"graph": {"hops": -1}})


async def test_json_in_a_text_answer_is_accepted() -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart(json.dumps(ADA))])

    result = await ChunkExtractor(FunctionModel(model)).extract_chunk(chunk("x"))
    assert result is not None and result.entities[0].name == "Ada Lovelace"


async def test_output_that_stays_invalid_is_skipped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scripted = ScriptedExtractor({"bad": MALFORMED})
    extractor = ChunkExtractor(scripted.model(), max_retries=1)
    with caplog.at_level(logging.WARNING):
        assert await extractor.extract_chunk(chunk("bad text", order=3)) is None
    assert scripted.calls == 2  # the first answer and one output retry
    assert "chunk c3 (#3 of document d1)" in caplog.text


async def test_an_invalid_field_counts_as_invalid_output() -> None:
    bad = {"entities": [{"name": ""}], "relationships": []}
    scripted = ScriptedExtractor({"x": bad})
    assert await ChunkExtractor(scripted.model(), max_retries=0).extract_chunk(chunk("x")) is None


class Flaky:
    """Raises the given errors in turn, then answers."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, ADA)])


async def test_transient_failures_are_retried_with_backoff() -> None:
    flaky = Flaky(ModelHTTPError(503, "m"), ModelRateLimitError("m", "slow down"))
    sleep = NoSleep()
    extractor = ChunkExtractor(FunctionModel(flaky), max_retries=2, sleep=sleep)
    result = await extractor.extract_chunk(chunk("x"))
    assert result is not None and flaky.calls == 3
    assert sleep.delays == [1.0, 2.0]


async def test_persistent_transient_failures_raise_one_clear_error() -> None:
    flaky = Flaky(*(TimeoutError("read timed out") for _ in range(5)))
    extractor = ChunkExtractor(FunctionModel(flaky), max_retries=1, sleep=NoSleep())
    with pytest.raises(ExtractionError, match=r"after 2 attempt\(s\): TimeoutError"):
        await extractor.extract_chunk(chunk("x"))
    assert flaky.calls == 2


async def test_permanent_failures_are_not_retried() -> None:
    flaky = Flaky(ModelHTTPError(401, "m", {"error": "bad key"}))
    extractor = ChunkExtractor(FunctionModel(flaky), sleep=NoSleep())
    with pytest.raises(ExtractionError, match="credentials"):
        await extractor.extract_chunk(chunk("x"))
    assert flaky.calls == 1


async def test_a_chunk_too_long_for_the_model_is_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flaky = Flaky(ModelContextWindowExceededError("m", "too long"))
    with caplog.at_level(logging.WARNING):
        assert await ChunkExtractor(FunctionModel(flaky)).extract_chunk(chunk("x")) is None
    assert "skipped chunk c0" in caplog.text


async def test_an_unknown_model_fails_clearly() -> None:
    extractor = ChunkExtractor("nosuchprovider:model")
    with pytest.raises(ExtractionError, match=r"graph\.extractor_model 'nosuchprovider:model'"):
        await extractor.extract_chunk(chunk("x"))


def test_transient_classification() -> None:
    assert _is_transient(ModelHTTPError(500, "m"))
    assert _is_transient(ModelHTTPError(429, "m"))
    assert not _is_transient(ModelHTTPError(400, "m"))
    assert not _is_transient(ModelAuthenticationError("m", "no"))
    assert not _is_transient(ModelQuotaExceededError("m", "no"))
    assert _is_transient(ModelAPIError("m", "connection reset"))
    assert _is_transient(ConnectionResetError())
    assert not _is_transient(UserError("bad setup"))
    assert not _is_transient(ValueError("bug"))


async def test_calls_run_concurrently_within_the_bound() -> None:
    active = 0
    peak = 0

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1
        text = prompt_text(messages)
        return ModelResponse(
            parts=[ToolCallPart(info.output_tools[0].name, {"entities": [{"name": text[-2:]}]})]
        )

    extractor = ChunkExtractor(FunctionModel(model), concurrency=3)
    chunks = [chunk(f"n{i:02d}", order=i) for i in range(10)]
    seen: list[str] = []
    results = await extractor.extract(chunks, lambda c, e: seen.append(c.id))
    assert peak == 3
    assert sorted(seen) == sorted(c.id for c in chunks)
    assert set(results) == {c.id for c in chunks}
    assert all(result is not None for result in results.values())


async def test_the_first_hard_failure_cancels_the_rest() -> None:
    started: list[str] = []

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        text = prompt_text(messages)
        started.append(text)
        if "boom" in text:
            raise ModelHTTPError(401, "m")
        await asyncio.sleep(5)
        raise AssertionError("should have been cancelled")

    extractor = ChunkExtractor(FunctionModel(model), concurrency=2)
    chunks = [chunk("slow", 0), chunk("boom", 1), chunk("never", 2)]
    with pytest.raises(ExtractionError):
        await asyncio.wait_for(extractor.extract(chunks), timeout=3)
    assert not any("never" in text for text in started)


def test_output_model_rules() -> None:
    with pytest.raises(ValidationError):
        Extraction.model_validate({"entities": [{"name": "Y", "type": 7}]})
    parsed = Extraction.model_validate(
        {
            "entities": [{"name": "X", "type": " technology "}],
            "relationships": [{"from": "X", "to": "Y", "weight": 3}, {"from": "Y", "to": "X"}],
        }
    )
    assert parsed.entities[0].type is EntityType.TECHNOLOGY
    assert [r.weight for r in parsed.relationships] == [1.0, 1.0]
    assert parsed.relationships[1].type == "RELATED_TO"
    assert parsed.model_dump(by_alias=True)["relationships"][0]["from"] == "X"
    with pytest.raises(ValidationError):
        Extraction.model_validate({"relationships": [{"from": "a", "to": "b", "weight": math.nan}]})
    with pytest.raises(ValidationError):
        Extraction.model_validate({"relationships": [{"from": "a"}]})
