"""mkdocs hooks: generate reference tables from the code, so the docs cannot drift.

A page containing `<!-- config-reference -->` gets the table of every AppConfig
setting, built from the pydantic models' fields, defaults and descriptions.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from haiku.rag.config import AppConfig

CONFIG_MARKER = "<!-- config-reference -->"


def _default(field: Any) -> str:
    if field.default_factory is not None:
        return "*(computed)*"
    if field.default is PydanticUndefined or field.default is None:
        return "unset"
    return f"`{field.default}`"


def config_reference() -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for section_name, section in AppConfig.model_fields.items():
        if section.exclude:
            continue
        model = section.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for name, field in model.model_fields.items():
            description = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{section_name}.{name}` | {_default(field)} | {description} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **_: Any) -> str:
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    return markdown
