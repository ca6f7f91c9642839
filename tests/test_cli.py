from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from haiku.rag.cli import app


@pytest.fixture
def cli(tmp_path: Path, monkeypatch):
    """Invoke `haiku-rag` against a store in tmp_path with the deterministic embedder."""
    config = tmp_path / "haiku.rag.yaml"
    config.write_text(yaml.safe_dump({"embeddings": {"model": "hash:v1", "dimension": 256}}))
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(config))
    monkeypatch.setenv("HAIKU_RAG_DB", str(tmp_path / "kb.lancedb"))
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args), catch_exceptions=False)

    return invoke


def test_add_then_search_table_and_json(cli, corpus: Path):
    result = cli("add", str(corpus))
    assert result.exit_code == 0, result.output
    assert "5 added" in result.stdout and "chunks embedded" in result.stdout

    result = cli("search", "Rust full-text search engine")
    assert result.exit_code == 0
    assert "Tantivy" in result.stdout.split("\n", 4)[3]  # the first row is the best hit

    result = cli("search", "Rust full-text search engine", "--json", "-k", "2")
    rows = json.loads(result.stdout)
    assert len(rows) == 2 and rows[0]["document_uri"].endswith("tantivy.md")
    assert rows[0]["rank"] == 1 and "signal_ranks" in rows[0]

    again = cli("add", str(corpus))
    assert "5 unchanged" in again.stdout and "nothing to embed" in again.stdout


def test_list_get_delete_info(cli, corpus: Path):
    cli("add", str(corpus))
    listed = json.loads(cli("list", "--json").stdout)
    assert len(listed) == 5 and "content" not in listed[0]
    assert "LanceDB" in cli("list").stdout

    got = cli("get", str(corpus / "lancedb.md"))
    assert got.exit_code == 0 and "embedded vector database" in got.stdout

    info = cli("info")
    assert info.exit_code == 0
    lines = dict(line.split(None, 1) for line in info.stdout.splitlines())
    assert lines["documents"] == "5" and lines["driver"] == "lancedb"
    assert lines["embedding_model"] == "hash:v1"
    assert lines["config_file"].endswith("haiku.rag.yaml")

    assert cli("delete", listed[0]["id"]).exit_code == 0
    missing = cli("delete", listed[0]["id"])
    assert missing.exit_code == 1 and "No document" in missing.output
    assert cli("get", "nope").exit_code == 1
    assert cli("rebuild").exit_code == 0
    assert cli("search", "nothing-matches-this-zzzz", "--filter", "nomatch").stdout.strip() == (
        "No results."
    )


def test_errors_are_one_line_without_traceback(cli, tmp_path: Path):
    result = cli("search", "anything")
    assert result.exit_code == 1
    assert "Error:" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 2

    result = cli("add", str(tmp_path / "missing-dir"))
    assert result.exit_code == 1 and "missing-dir" in result.output


def test_verbose_shows_traceback(cli):
    result = cli("-v", "info")
    assert result.exit_code == 1 and "Traceback" in result.output


def test_failed_documents_are_listed_and_exit_nonzero(cli, corpus: Path):
    (corpus / "broken.md").write_bytes(b"\x00\x01binary")
    result = cli("add", str(corpus))
    assert result.exit_code == 1
    assert "broken.md" in result.output and "1 failed" in result.stdout


@pytest.mark.parametrize("name", ["kb.lancedb", "kb.yaml", "kb.duckdb"])
def test_a_typo_in_the_source_leaves_no_empty_store(cli, tmp_path: Path, name: str, monkeypatch):
    db = tmp_path / "typo" / name
    monkeypatch.setenv("HAIKU_RAG_DB", str(db))
    result = cli("add", str(tmp_path / "no-such-folder"))
    assert result.exit_code == 1 and "no-such-folder" in result.output
    assert not db.exists() and not db.with_suffix(".yaml").exists()
