"""mkdocs hooks: generate reference tables from the code, so the docs cannot drift.

A page containing `<!-- config-reference -->` gets the table of every AppConfig
setting, built from the pydantic models' fields, defaults and descriptions; one
containing `<!-- cli-reference -->` gets every `haiku-rag` command with its usage
and options, built from the typer app (the same text `--help` prints).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from haiku.rag.config import AppConfig

CONFIG_MARKER = "<!-- config-reference -->"
CLI_MARKER = "<!-- cli-reference -->"


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
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            # a top-level setting (e.g. `rag_template`), not a section
            description = (section.description or "").replace("|", "\\|")
            rows.append(f"| `{section_name}` | {_default(section)} | {description} |")
            continue
        for name, field in model.model_fields.items():
            description = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{section_name}.{name}` | {_default(field)} | {description} |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _command_reference(command: Any, parent: Any, path: str, level: int) -> list[str]:
    """One command: heading, help, usage and its options, as `--help` would show them."""
    ctx = command.context_class(command, info_name=path.rsplit(" ", 1)[-1], parent=parent)
    lines = [f"{'#' * level} `{path}`", ""]
    if command.help:
        lines += [command.help.strip(), ""]
    usage = command.get_usage(ctx).removeprefix("Usage: ")
    lines += ["```text", usage, "```", ""]
    records = [param.get_help_record(ctx) for param in command.params if not param.hidden]
    records = [record for record in records if record is not None]
    if records:
        lines += ["| argument or option | meaning |", "|---|---|"]
        lines += [f"| `{_cell(decl)}` | {_cell(help)} |" for decl, help in records]
        lines.append("")
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            lines += _command_reference(sub, ctx, f"{path} {name}", level + 1)
    return lines


def cli_reference() -> str:
    """The `haiku-rag` typer app rendered from its click commands (same text as `--help`)."""
    import typer

    from haiku.rag.cli import app

    root = typer.main.get_command(app)
    return "\n".join(_command_reference(root, None, "haiku-rag", 2))


def on_page_markdown(markdown: str, **_: Any) -> str:
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown
