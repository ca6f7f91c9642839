"""Named knowledge bases: the rags dir, `HaikuRAG.open(name)`, `--rag`, `rags`, `info`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import haiku.rag.cli as cli_module
from haiku.rag.cli import app
from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig, config_from_dict
from haiku.rag.errors import StoreError, StoreNotFoundError
from haiku.rag.rags import (
    RAGS_DIR_ENV,
    RagEntry,
    check_name,
    describe_rags,
    find_rag,
    list_rags,
    rags_dir,
    resolve_rag,
)
from haiku.rag.store import DRIVERS


def _duckdb_ready() -> bool:
    if "duckdb" not in DRIVERS:
        return False
    try:
        import duckdb  # noqa: F401

        import haiku.rag.store.duckdb  # noqa: F401
    except ImportError:
        return False
    return True


DRIVER_PARAMS = [
    "lancedb",
    "yaml",
    pytest.param(
        "duckdb",
        marks=pytest.mark.skipif(not _duckdb_ready(), reason="duckdb driver not available"),
    ),
]


@pytest.fixture
def rags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "rags"
    monkeypatch.setenv(RAGS_DIR_ENV, str(directory))
    return directory


@pytest.fixture
def cfg(tmp_path: Path) -> AppConfig:
    return config_from_dict(
        {
            "embeddings": {"model": "hash:v1", "dimension": 64},
            "storage": {"data_dir": str(tmp_path / "data")},
        }
    )


# ----------------------------------------------------------------------- the dir


def test_rags_dir_env_then_config_then_data_dir(tmp_path: Path, monkeypatch):
    config = config_from_dict({"storage": {"data_dir": str(tmp_path / "data")}})
    assert rags_dir(config) == tmp_path / "data" / "rags"
    configured = config_from_dict({"storage": {"rags_dir": "~/my-rags"}})
    assert rags_dir(configured) == Path.home() / "my-rags"
    monkeypatch.setenv(RAGS_DIR_ENV, str(tmp_path / "env"))
    assert rags_dir(configured) == tmp_path / "env"
    assert rags_dir() == tmp_path / "env"  # the config file in load order (here: defaults)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "empty"),
        (" notes", "space"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        (".hidden", "starts with a dot"),
        ("notes.lancedb", "the name is 'notes'"),
        ("notes.YAML", "the name is 'notes'"),
        ("x.qdrant", "the name is 'x'"),
    ],
)
def test_invalid_names_are_clear_errors(name: str, message: str, cfg: AppConfig):
    with pytest.raises(StoreError, match=message):
        check_name(name)
    with pytest.raises(StoreError, match="Invalid knowledge base name"):
        HaikuRAG.open(name, cfg, create=True)


def test_valid_names():
    assert check_name("my.notes-2024_v2") == "my.notes-2024_v2"


# ------------------------------------------------------------------- by driver


@pytest.mark.parametrize("driver", DRIVER_PARAMS)
async def test_named_knowledge_base_across_drivers(driver: str, rags: Path, cfg: AppConfig):
    created = HaikuRAG.open("notes", cfg, create=True, driver=driver)
    assert isinstance(created, HaikuRAG) and created.rag_name == "notes"
    assert created.driver == driver
    async with created as kb:
        await kb.add_text("Sourdough needs a lively starter.", uri="mem:bread")
    entry = find_rag("notes", cfg)
    assert entry is not None and entry.driver == driver and entry.exists and entry.size > 0

    async with HaikuRAG.open("notes", cfg, read_only=True) as kb:  # driver found by name
        assert kb.driver == driver
        [hit] = await kb.search("sourdough starter", top_k=1)
        assert hit.document_uri == "mem:bread"
        info = await kb.info()
        assert info.driver == driver and info.extra["rag"] == "notes"

    kb = HaikuRAG.named("notes", cfg)
    assert await kb.open() is kb  # the instance method is still `open`
    kb.close()

    with pytest.raises(StoreError, match=f"uses the {driver} driver"):
        HaikuRAG.open("notes", cfg, driver="yaml" if driver != "yaml" else "lancedb")
    [summary] = describe_rags(cfg)
    assert (summary.name, summary.driver, summary.documents, summary.chunks) == (
        "notes",
        driver,
        1,
        1,
    )
    assert summary.size == entry.size and summary.error is None


async def test_missing_name_without_create(rags: Path, cfg: AppConfig):
    with pytest.raises(StoreNotFoundError, match=r"No knowledge base named 'nope'.*--rag nope"):
        HaikuRAG.open("nope", cfg)
    (rags / "other.lancedb").mkdir(parents=True)
    with pytest.raises(StoreNotFoundError, match=r"\(there are: other\)"):
        HaikuRAG.open("nope", cfg)


def test_new_name_uses_the_default_or_configured_driver(rags: Path, cfg: AppConfig):
    assert resolve_rag("fresh", cfg, create=True) == RagEntry(
        "fresh", "lancedb", rags / "fresh.lancedb"
    )
    yaml_cfg = cfg.model_copy(deep=True)
    yaml_cfg.storage.driver = "yaml"
    assert resolve_rag("fresh", yaml_cfg, create=True).location == rags / "fresh.yaml"
    with pytest.raises(StoreError, match="choose one of yaml, duckdb, lancedb"):
        resolve_rag("fresh", cfg, create=True, driver="qdrant")


def test_layouts_ambiguity_and_attach_files(rags: Path, cfg: AppConfig):
    rags.mkdir()
    (rags / "both.lancedb").mkdir()
    (rags / "both.yaml").write_text('haiku_rag: {"format": 1, "driver": "yaml"}\n')
    with pytest.raises(StoreError, match=r"'both' is ambiguous.*both.lancedb, both.yaml"):
        find_rag("both", cfg)
    # a duckdb sidecar alone (its database missing) is still the duckdb store
    (rags / "side.yaml").write_text(
        '# haiku.rag\nhaiku_rag: {"format": 1, "driver": "duckdb"}\nsettings: {}\n'
    )
    side = find_rag("side", cfg)
    assert side is not None and side.driver == "duckdb"
    assert side.location == rags / "side.duckdb" and side.files == (rags / "side.yaml",)
    (rags / "side.duckdb").write_bytes(b"x" * 10)
    (rags / "side.duckdb.wal").write_bytes(b"w" * 5)
    side = find_rag("side", cfg)
    assert side is not None and side.size == 10 + 5 + (rags / "side.yaml").stat().st_size
    (rags / "block.yaml").write_text("haiku_rag:\n  driver: duckdb\n")
    assert find_rag("block", cfg).driver == "yaml"  # type: ignore[union-attr]
    (rags / "flow.yaml").write_text("haiku_rag: {driver: duckdb, format: 1}\n")
    assert find_rag("flow", cfg).driver == "duckdb"  # type: ignore[union-attr]
    (rags / "odd.yaml").write_text("haiku_rag: {driver: [\n")
    assert find_rag("odd", cfg).driver == "yaml"  # type: ignore[union-attr]
    (rags / "plain.yaml").write_text("name: not a store\n")
    assert find_rag("plain", cfg).driver == "yaml"  # type: ignore[union-attr]
    (rags / "folder.yaml").mkdir()  # unreadable as a file: left for the driver to judge
    assert find_rag("folder", cfg).driver == "yaml"  # type: ignore[union-attr]
    (rags / "remote.qdrant.yaml").write_text("collection: docs\n")
    remote = find_rag("remote", cfg)
    assert remote is not None and remote.driver == "qdrant"
    assert remote.location == rags / "remote.qdrant.yaml"
    (rags / ".hidden.lancedb").mkdir()
    (rags / "notes.txt").write_text("not a store")

    names = [entry.name for entry in list_rags(cfg)]
    assert names == ["block", "flow", "folder", "odd", "plain", "remote", "side"]
    summaries = {summary.name: summary for summary in describe_rags(cfg)}
    assert set(summaries) == {"both", *names}
    assert "ambiguous" in (summaries["both"].error or "") and summaries["both"].driver is None
    assert "not contacted" in (summaries["remote"].error or "")
    assert summaries["side"].documents is None and summaries["side"].error


def test_unlistable_rags_dir(tmp_path: Path, monkeypatch, cfg: AppConfig):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv(RAGS_DIR_ENV, str(blocker))
    with pytest.raises(StoreError, match="Cannot list the rags dir"):
        list_rags(cfg)
    monkeypatch.setenv(RAGS_DIR_ENV, str(tmp_path / "missing"))
    assert list_rags(cfg) == [] and describe_rags(cfg) == []


async def test_a_store_that_fails_to_count_is_listed_with_its_error(
    rags: Path, cfg: AppConfig, monkeypatch
):
    async with HaikuRAG.open("kb", cfg, create=True, driver="yaml") as kb:
        await kb.add_text("text", uri="mem:a")
    from haiku.rag.store.yaml import YamlStore

    def broken(self: YamlStore) -> int:
        raise StoreError("count failed")

    monkeypatch.setattr(YamlStore, "count_chunks", broken)
    [summary] = describe_rags(cfg)
    assert summary.error == "count failed" and summary.documents is None


# ------------------------------------------------------------------------ CLI


@pytest.fixture
def cli(tmp_path: Path, rags: Path, monkeypatch):
    config = tmp_path / "haiku.rag.yaml"
    config.write_text(yaml.safe_dump({"embeddings": {"model": "hash:v1", "dimension": 64}}))
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(config))
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):
        return runner.invoke(app, list(args), input=input, catch_exceptions=False)

    return invoke


def test_cli_rag_option_and_rags_listing(cli, corpus: Path, rags: Path, monkeypatch):
    monkeypatch.setattr(cli_module, "_stdin_is_tty", lambda: False)
    empty = cli("rags")
    assert empty.exit_code == 0 and "No knowledge bases in" in empty.stdout

    added = cli("--rag", "docs", "add", str(corpus))  # not a TTY: the default driver
    assert added.exit_code == 0, added.output
    assert (rags / "docs.lancedb").is_dir()
    assert (
        cli("--rag", "small", "--driver", "yaml", "add", str(corpus / "tantivy.md")).exit_code == 0
    )

    result = cli("--rag", "docs", "search", "Rust search engine", "--json", "-k", "1")
    assert json.loads(result.stdout)[0]["document_uri"].endswith("tantivy.md")

    table = cli("rags")
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert str(rags) in lines[0]
    docs_row = next(line for line in lines if " docs " in line)
    assert "lancedb" in docs_row and " 5 " in docs_row and "KB" in docs_row
    rows = {row["name"]: row for row in json.loads(cli("rags", "--json").stdout)}
    assert rows["docs"]["documents"] == 5 and rows["docs"]["driver"] == "lancedb"
    assert rows["small"]["driver"] == "yaml" and rows["small"]["chunks"] == 1
    assert rows["small"]["location"] == str(rags / "small.yaml")

    info = cli("--rag", "small", "info")
    lines = dict(line.split(None, 1) for line in info.stdout.splitlines())
    assert lines["rags_dir"] == str(rags) and lines["rag"] == "small"
    assert lines["driver"] == "yaml" and lines["path"] == str(rags / "small.yaml")

    missing = cli("--rag", "nope", "search", "x")
    assert missing.exit_code == 1 and "No knowledge base named 'nope'" in missing.output
    bad = cli("--rag", "a/b", "search", "x")
    assert bad.exit_code == 1 and "path separator" in bad.output


def test_cli_rag_and_db_together(cli, tmp_path: Path, corpus: Path, monkeypatch):
    both = cli("--rag", "docs", "--db", str(tmp_path / "x.lancedb"), "search", "q")
    assert both.exit_code == 2 and "--rag and --db" in both.output
    # HAIKU_RAG_DB is only a default: --rag on the command line wins over it
    monkeypatch.setattr(cli_module, "_stdin_is_tty", lambda: False)
    monkeypatch.setenv("HAIKU_RAG_DB", str(tmp_path / "env.lancedb"))
    assert cli("--rag", "docs", "add", str(corpus / "tantivy.md")).exit_code == 0
    assert not (tmp_path / "env.lancedb").exists()


def test_cli_asks_for_the_driver_of_a_new_knowledge_base(
    cli, corpus: Path, rags: Path, monkeypatch
):
    monkeypatch.setattr(cli_module, "_stdin_is_tty", lambda: True)
    result = cli("--rag", "asked", "add", str(corpus / "tantivy.md"), input="sqlite\nyaml\n")
    assert result.exit_code == 0, result.output
    assert "driver (yaml, duckdb, lancedb) [lancedb]" in result.output
    assert (rags / "asked.yaml").is_file()

    defaulted = cli("--rag", "enter", "add", str(corpus / "tantivy.md"), input="\n")
    assert defaulted.exit_code == 0 and (rags / "enter.lancedb").is_dir()

    # --driver skips the question, and so does an existing name
    quiet = cli("--rag", "flag", "--driver", "yaml", "add", str(corpus / "tantivy.md"))
    assert quiet.exit_code == 0 and "driver (" not in quiet.output
    again = cli("--rag", "asked", "add", str(corpus / "tantivy.md"))
    assert again.exit_code == 0 and "driver (" not in again.output
    # reading never asks (nor creates)
    assert cli("--rag", "never", "search", "x").exit_code == 1
    assert not any(path.name.startswith("never") for path in rags.iterdir())


def _console_script() -> str:
    found = Path(sys.executable).parent / "haiku-rag"
    return str(found) if found.exists() else shutil.which("haiku-rag") or "haiku-rag"


@pytest.mark.parametrize("with_store", [False, True])
def test_info_pipeline_prints_the_rags_directory(tmp_path: Path, corpus: Path, with_store: bool):
    """`haiku-rag info | grep rags_dir | awk '{print $2}'`, with and without a store.

    (The test name keeps `rags_dir` out of tmp_path, which grep would match too.)
    """
    directory = tmp_path / "rags-dir"  # no spaces: awk splits on them
    env = {
        **os.environ,
        RAGS_DIR_ENV: str(directory),
        "HAIKU_RAG_DB": str(tmp_path / "kb.lancedb"),
        "HAIKU_RAG_CONFIG": str(tmp_path / "haiku.rag.yaml"),
        "PATH": f"{Path(_console_script()).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    (tmp_path / "haiku.rag.yaml").write_text("embeddings: {model: 'hash:v1', dimension: 64}\n")
    if with_store:
        added = subprocess.run(
            [_console_script(), "add", str(corpus / "tantivy.md")],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert added.returncode == 0, added.stderr
    result = subprocess.run(
        ["bash", "-c", "haiku-rag info | grep rags_dir | awk '{print $2}'"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0
    assert result.stdout == f"{directory}\n"
    assert ("No haiku.rag store" in result.stderr) is not with_store
