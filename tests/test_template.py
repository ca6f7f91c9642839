"""The RAG template: validation at config load, and the shape of a filled template."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from haiku.rag.config import config_from_dict, load_config
from haiku.rag.documents import SearchResult
from haiku.rag.errors import ConfigError
from haiku.rag.template import (
    DEFAULT_TEMPLATE,
    TemplateError,
    fill_template,
    missing_placeholders,
    validate_template,
)


def hit(uri: str, content: str, rank: int, title: str | None = None) -> SearchResult:
    return SearchResult(
        chunk_id=f"c{rank}",
        document_id=uri[-4:],
        document_uri=uri,
        document_title=title,
        content=content,
        score=1.0 / rank,
        rank=rank,
    )


def test_default_template_is_valid_and_says_what_it_must():
    assert validate_template(DEFAULT_TEMPLATE) is DEFAULT_TEMPLATE
    assert "__SOURCES__" in DEFAULT_TEMPLATE
    text = DEFAULT_TEMPLATE.lower()
    assert "cite" in text and "do not know" in text and "language of the question" in text
    assert config_from_dict({}).rag_template is None


@pytest.mark.parametrize(
    ("template", "missing"),
    [
        ("Question: __INPUT__", ["__CONTEXT__"]),
        ("Context: __CONTEXT__ __SOURCES__", ["__INPUT__"]),
        ("Just answer.", ["__INPUT__", "__CONTEXT__"]),
    ],
)
def test_a_template_missing_a_required_placeholder_is_rejected(template: str, missing: list[str]):
    assert missing_placeholders(template) == missing
    with pytest.raises(TemplateError) as raised:
        validate_template(template)
    for name in missing:
        assert name in str(raised.value)
    assert isinstance(raised.value, ConfigError)
    assert ("placeholders" in str(raised.value)) == (len(missing) > 1)

    with pytest.raises(ConfigError, match="rag_template") as at_load:
        config_from_dict({"rag_template": template})
    for name in missing:
        assert name in str(at_load.value)


def test_sources_placeholder_is_optional_and_file_errors_name_the_file(tmp_path: Path):
    assert config_from_dict({"rag_template": "__CONTEXT__\n__INPUT__"}).rag_template
    file = tmp_path / "haiku.rag.yaml"
    file.write_text(yaml.safe_dump({"rag_template": "Q: __INPUT__"}))
    with pytest.raises(ConfigError, match=r"haiku\.rag\.yaml.*__CONTEXT__"):
        load_config(file)


def test_fill_numbers_sources_and_heads_each_chunk():
    results = [
        hit("file:///a.md", "  Alpha one.  ", 1, title="Alpha"),
        hit("mem://b", "Beta.", 2),
        hit("file:///a.md", "Alpha two.", 3, title="Alpha"),
    ]
    filled = fill_template("C:\n__CONTEXT__\nS:\n__SOURCES__\nQ: __INPUT__", "Why?", results)
    assert filled == (
        "C:\n"
        "[1] Alpha — file:///a.md\nAlpha one.\n\n"
        "[2] mem://b\nBeta.\n\n"
        "[1] Alpha — file:///a.md\nAlpha two.\n"
        "S:\n[1] file:///a.md\n[2] mem://b\n"
        "Q: Why?"
    )


def test_fill_is_one_pass_and_handles_no_results():
    results = [hit("mem://x", "a chunk quoting __INPUT__ and __SOURCES__", 1)]
    filled = fill_template("__INPUT__ | __CONTEXT__", "what is __CONTEXT__?", results)
    assert filled == "what is __CONTEXT__? | [1] mem://x\na chunk quoting __INPUT__ and __SOURCES__"
    assert fill_template("__INPUT__|__CONTEXT__|__SOURCES__", "q", []) == "q||"
