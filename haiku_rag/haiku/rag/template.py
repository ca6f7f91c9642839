"""The RAG template: the prompt that wraps retrieved chunks around a question.

A template is plain text with placeholders, filled in one pass:

- `__INPUT__` (required): the question;
- `__CONTEXT__` (required): the retrieved chunks, each headed by `[n] title — uri`;
- `__SOURCES__` (optional): the numbered list of distinct source uris.

`n` numbers *sources* (distinct documents, in rank order of their best chunk), so
the headers in `__CONTEXT__` and the lines of `__SOURCES__` agree and the model can
cite `[n]` either way. Set `rag_template` in the config to replace the default; a
template missing a required placeholder is rejected when the config loads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from haiku.rag.documents import SearchResult
from haiku.rag.errors import ConfigError

INPUT = "__INPUT__"
CONTEXT = "__CONTEXT__"
SOURCES = "__SOURCES__"
REQUIRED = (INPUT, CONTEXT)

DEFAULT_TEMPLATE = f"""\
Answer the question below using the context, which was retrieved from a knowledge base.

Rules:
- Base your answer on the context. Cite the sources you use by their number in square
  brackets, e.g. [1] or [2][3].
- If the context does not contain the answer, say that you do not know; do not guess.
- Answer in the language of the question.

Context:
{CONTEXT}

Sources:
{SOURCES}

Question: {INPUT}
"""

_PLACEHOLDER = re.compile("|".join(re.escape(name) for name in (INPUT, CONTEXT, SOURCES)))


class TemplateError(ConfigError, ValueError):
    """A template misses a required placeholder. A ValueError too, so pydantic reports it
    under the config key (`rag_template`) and the file it came from."""


def missing_placeholders(template: str) -> list[str]:
    return [name for name in REQUIRED if name not in template]


def validate_template(template: str) -> str:
    """Return `template` unchanged, or raise `TemplateError` naming what is missing."""
    missing = missing_placeholders(template)
    if missing:
        names = " and ".join(missing)
        noun = "placeholders" if len(missing) > 1 else "placeholder"
        raise TemplateError(
            f"the RAG template has no {names} {noun}: add {names} where the "
            f"{_what(missing)} should go ({INPUT} and {CONTEXT} are required, "
            f"{SOURCES} is optional)"
        )
    return template


def _what(missing: list[str]) -> str:
    meaning = {INPUT: "question", CONTEXT: "retrieved context"}
    return " and ".join(meaning[name] for name in missing)


def source_numbers(results: Sequence[SearchResult]) -> dict[str, int]:
    """Document uri -> its source number, in order of first appearance (best rank first)."""
    numbers: dict[str, int] = {}
    for result in results:
        numbers.setdefault(result.document_uri, len(numbers) + 1)
    return numbers


def render_context(results: Sequence[SearchResult]) -> str:
    """The chunks, each headed by `[n] title — uri` (`[n] uri` when there is no title)."""
    numbers = source_numbers(results)
    blocks = []
    for result in results:
        n = numbers[result.document_uri]
        title = result.document_title
        header = (
            f"[{n}] {title} — {result.document_uri}" if title else f"[{n}] {result.document_uri}"
        )
        blocks.append(f"{header}\n{result.content.strip()}")
    return "\n\n".join(blocks)


def render_sources(results: Sequence[SearchResult]) -> str:
    return "\n".join(f"[{n}] {uri}" for uri, n in source_numbers(results).items())


def is_filled(template: str, text: str) -> bool:
    """Whether `text` is `template` filled in (its fixed text, in order, around anything);
    used to recognise context that is already in a conversation."""
    pieces = _PLACEHOLDER.split(template)
    pattern = "(?s)" + ".*".join(re.escape(piece) for piece in pieces)
    return re.fullmatch(pattern, text) is not None


def fill_template(template: str, question: str, results: Sequence[SearchResult]) -> str:
    """Fill every placeholder in one pass, so placeholder-like text inside the question or
    a chunk is left as it is instead of being replaced in turn."""
    values = {
        INPUT: question,
        CONTEXT: render_context(results),
        SOURCES: render_sources(results),
    }
    return _PLACEHOLDER.sub(lambda match: values[match.group(0)], template)
