"""A scripted chat model that stands in for any real one in examples and docs tests.

It plays the RAG capability's loop the way a good model would: search for the user's
question, cite the first hit (or cite nothing when nothing was found), then answer.
`offline_models` makes every model *name* (`"openai:gpt-5"`) resolve to it, so code
written for users runs unchanged, with no network and no API key.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import models
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

ANSWER = "According to the knowledge base [1]."


def _question(messages: list[ModelMessage]) -> str:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


def scripted_model(answer: str = ANSWER) -> FunctionModel:
    """Search the question, cite the first chunk found, answer with `answer`."""

    def run(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        tools = {tool.name for tool in info.function_tools}
        last = messages[-1]
        parts = last.parts if isinstance(last, ModelRequest) else []
        returned = [part for part in parts if isinstance(part, ToolReturnPart)]
        if (
            "search" in tools
            and not returned
            and not any(isinstance(part, RetryPromptPart) for part in parts)
        ):
            return ModelResponse(parts=[ToolCallPart("search", {"query": _question(messages)})])
        if returned and returned[0].tool_name == "search" and "cite" in tools:
            ids = (returned[0].metadata or {}).get("chunk_ids", [])[:1]
            return ModelResponse(parts=[ToolCallPart("cite", {"chunk_ids": ids})])
        return ModelResponse(parts=[TextPart(answer)])

    return FunctionModel(run, model_name="scripted")


@pytest.fixture
def offline_models(monkeypatch: pytest.MonkeyPatch) -> FunctionModel:
    """Every chat model name resolves to the scripted model for the test's duration."""
    model = scripted_model()
    real = models.infer_model

    def infer(name: Any, *args: Any, **kwargs: Any) -> Any:
        return model if isinstance(name, str) else real(name, *args, **kwargs)

    monkeypatch.setattr(models, "infer_model", infer)
    return model
