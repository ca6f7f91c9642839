"""Shared fixtures: an isolated environment, a deterministic config, a small corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from haiku.rag.config import AppConfig, config_from_dict

CORPUS = {
    "lancedb.md": "# LanceDB\n\nLanceDB is an embedded vector database built on the Lance "
    "columnar format.\n\n## Indexes\n\nIt supports IVF_PQ vector indexes and native "
    "full-text search.\n",
    "tantivy.md": "# Tantivy\n\nTantivy is a full-text search engine library written in Rust, "
    "inspired by Apache Lucene. It ranks documents with BM25.\n",
    "cooking/pasta.md": "# Pasta\n\nBoil salted water, add the spaghetti and cook for nine "
    "minutes. Toss with olive oil, garlic and chili.\n",
    "cooking/bread.txt": "Sourdough bread needs a lively starter, flour, water and salt. "
    "Bake at 250 degrees with steam for the first twenty minutes.\n",
    "notes/rrf.md": "# Reciprocal Rank Fusion\n\nRRF merges ranked lists: each list adds "
    "weight / (k + rank) to a document's score, with k = 60 by default.\n",
}


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """No test reads the developer's config, data dir or environment."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("HAIKU_RAG_CONFIG", "HAIKU_RAG_DB", "HAIKU_RAG_RAGS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(home)
    return home


@pytest.fixture
def config(tmp_path: Path) -> AppConfig:
    """Deterministic embeddings, so rankings are reproducible and no model is loaded."""
    return config_from_dict(
        {
            "embeddings": {"model": "hash:v1", "dimension": 256},
            "storage": {"data_dir": str(tmp_path / "data")},
        }
    )


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    for name, text in CORPUS.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root
