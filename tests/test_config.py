from __future__ import annotations

from pathlib import Path

import pytest

from haiku.rag.config import (
    AppConfig,
    config_from_dict,
    find_config_file,
    load_config,
    user_config_path,
)
from haiku.rag.errors import ConfigError


def test_defaults_match_the_design() -> None:
    config = AppConfig()
    assert config.embeddings.model == "local:all-MiniLM-L6-v2"
    assert config.search.top_k == 5
    assert (config.search.vector_weight, config.search.bm25_weight) == (1.125, 1.0)
    assert config.search.graph_weight == 0.9
    assert config.chunking.size is None  # 2000, or the embedder's window when shorter


def test_no_file_gives_defaults() -> None:
    config = load_config()
    assert config.source_path is None
    assert config == AppConfig()


def test_load_order_env_then_local_then_user(tmp_path: Path, monkeypatch) -> None:
    user = user_config_path()
    user.parent.mkdir(parents=True)
    user.write_text("search: {top_k: 3}\n")
    assert load_config().search.top_k == 3
    assert find_config_file() == user

    Path("haiku.rag.yaml").write_text("search: {top_k: 4}\n")
    assert load_config().search.top_k == 4

    env_file = tmp_path / "env.yaml"
    env_file.write_text("search: {top_k: 7}\n")
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(env_file))
    config = load_config()
    assert config.search.top_k == 7
    assert config.source_path == env_file


def test_env_pointing_nowhere_is_an_error(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match=r"HAIKU_RAG_CONFIG points to .*missing\.yaml"):
        load_config()


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("search:\n  top_kk: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key 'search\.top_kk'"):
        load_config(path)


def test_invalid_value_is_named() -> None:
    with pytest.raises(ConfigError, match=r"'search\.top_k'.*greater than 0.*got -1"):
        config_from_dict({"search": {"top_k": -1}})


def test_model_needs_provider_prefix() -> None:
    with pytest.raises(ConfigError, match="needs a provider prefix"):
        config_from_dict({"embeddings": {"model": "all-MiniLM-L6-v2"}})


def test_overlap_must_be_smaller_than_size() -> None:
    with pytest.raises(ConfigError, match="overlap"):
        config_from_dict({"chunking": {"size": 100, "overlap": 100}})


def test_broken_yaml_and_non_mapping(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("search: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(scalar)
    with pytest.raises(ConfigError, match="Cannot read config file"):
        load_config(tmp_path)


def test_empty_file_is_defaults(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty).search == AppConfig().search
