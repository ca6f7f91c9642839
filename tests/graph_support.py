"""A scripted extractor for graph tests and the graph benchmark: a FunctionModel that answers
from a table of facts keyed by a phrase of the chunk, and counts its calls."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

MALFORMED = "{this is not json"


def prompt_text(messages: list[ModelMessage]) -> str:
    """The user prompt of the first request (the chunk, as the extractor framed it)."""
    for message in messages:
        for part in getattr(message, "parts", []):
            if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                return part.content
    return ""


class ScriptedExtractor:
    """`facts` maps a phrase to the extraction (a JSON-able dict, or MALFORMED) returned for
    any chunk containing it; a chunk matching nothing yields empty lists."""

    def __init__(self, facts: Mapping[str, dict[str, Any] | str]) -> None:
        self.facts = dict(facts)
        self.calls = 0
        self.prompts: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        text = prompt_text(messages)
        self.prompts.append(text)
        answer: dict[str, Any] | str = {"entities": [], "relationships": []}
        for phrase, extraction in self.facts.items():
            if phrase in text:
                answer = extraction
                break
        args = answer if isinstance(answer, str) else json.dumps(answer)
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args)])

    def model(self) -> FunctionModel:
        return FunctionModel(self, model_name="scripted-extractor")


def entity(name: str, kind: str = "OTHER", description: str = "") -> dict[str, str]:
    return {"name": name, "type": kind, "description": description}


def relation(source: str, target: str, kind: str = "RELATED_TO", weight: float = 1.0) -> dict:
    return {"from": source, "to": target, "type": kind, "weight": weight}
