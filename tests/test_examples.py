"""Every script in examples/ runs here, offline, so the examples cannot rot.

Chat models are the scripted stand-in (`scripted_models.offline_models`), embeddings
the deterministic `hash:v1`, Qdrant the loopback REST server of tests/qdrant_server.py;
the PDF example needs the real `pdftotext` (Debian: poppler-utils) and is skipped,
saying so, where it is missing.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from qdrant_client import models
from qdrant_server import QdrantTestServer
from scripted_models import ANSWER, offline_models  # noqa: F401 (fixture)

from haiku.rag.config import EmbeddingsConfig, config_from_dict
from haiku.rag.embeddings import EmbeddingService

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
HASH = {"model": "hash:v1", "dimension": 256}


def load_example(relative: str) -> ModuleType:
    """Import an example script by path (examples/ is not a package)."""
    path = EXAMPLES / relative
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def hash_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HAIKU_RAG_CONFIG -> the deterministic embedder, for examples that load the config."""
    path = tmp_path / "hash.yaml"
    path.write_text(yaml.safe_dump({"embeddings": HASH}), encoding="utf-8")
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(path))
    return path


def test_every_example_is_tested() -> None:
    """A new example needs a test here (the list below), or this fails."""
    found = sorted(
        str(path.relative_to(EXAMPLES)) for path in EXAMPLES.rglob("*.py") if path.is_file()
    )
    assert found == [
        "agent_over_folder.py",
        "pdf_loader/add_pdfs.py",
        "qdrant_attach.py",
        "test_citation_audit.py",
    ]


def test_agent_over_folder(
    corpus: Path,
    tmp_path: Path,
    hash_config_file: Path,
    offline_models: object,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    example = load_example("agent_over_folder.py")
    db = tmp_path / "folder.lancedb"
    argv = [str(corpus), "How does Reciprocal Rank Fusion merge lists?", "--db", str(db)]
    example.main(argv)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{corpus}: 5 added, 0 updated, 0 unchanged, 0 deleted, 0 failed; " + (
        "5 chunks embedded"
    )
    assert lines[1] == ANSWER
    assert lines[2].startswith("[1] file://") and "/notes/rrf.md (chunk " in lines[2]

    example.main(argv)  # a second run embeds nothing
    assert "0 added, 0 updated, 5 unchanged" in capsys.readouterr().out


def test_citation_audit_example_passes_under_pytest(tmp_path: Path) -> None:
    """The example is itself a test file: run it the way a user would."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(EXAMPLES / "test_citation_audit.py"),
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'pytest'}",
        ],
        cwd=EXAMPLES.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


async def test_qdrant_attach(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts = {
        "manuals/safety.md": "Everyone on site wears a hard hat and steel-toed boots.",
        "manuals/noise.md": "Hearing protection is required near the compressors.",
        "recipes/pasta.md": "Boil salted water and cook the spaghetti for nine minutes.",
    }
    embedder = EmbeddingService.from_config(EmbeddingsConfig(model="hash:v1", dimension=64))
    vectors = await embedder.embed_documents(list(texts.values()))
    points = [
        models.PointStruct(
            id=number,
            vector=[float(x) for x in vector],
            payload={"page_content": text, "metadata": {"source": source}},
        )
        for number, ((source, text), vector) in enumerate(zip(texts.items(), vectors, strict=True))
    ]
    example = load_example("qdrant_attach.py")
    attach_file = tmp_path / "docs.qdrant.yaml"
    with QdrantTestServer() as server:
        server.collection("manuals", 64, points)
        results = await example.search_collection(
            server.address, "manuals", "hard hat boots", model="hash:v1", attach_file=attach_file
        )
    assert results[0].document_uri == "manuals/safety.md"
    assert results[0].content == texts["manuals/safety.md"]
    assert {r.document_uri for r in results} == set(texts)
    printed = capsys.readouterr().out
    assert f"as {attach_file}" in printed and "3 points, 64-dimensional vectors" in printed
    assert "api_key" not in attach_file.read_text(encoding="utf-8").replace("api_key_env", "")


def test_qdrant_attach_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    embedder = EmbeddingService.from_config(EmbeddingsConfig(model="hash:v1", dimension=32))
    [vector] = asyncio.run(embedder.embed_documents(["LanceDB is an embedded database."]))
    point = models.PointStruct(
        id=7,
        vector=[float(x) for x in vector],
        payload={"page_content": "LanceDB is an embedded database.", "metadata": {"source": "a"}},
    )
    example = load_example("qdrant_attach.py")
    attach_file = tmp_path / "kb.qdrant.yaml"
    with QdrantTestServer() as server:
        server.collection("kb", 32, [point])
        argv = [server.address, "kb", "embedded database", "--model", "hash:v1"]
        example.main([*argv, "--attach-file", str(attach_file)])
    assert "1. a (" in capsys.readouterr().out


# the PDF loader -----------------------------------------------------------------------


def make_pdf(text: str) -> bytes:
    """A one-page PDF showing `text` in Helvetica (no PDF library needed)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


needs_pdftotext = pytest.mark.skipif(
    shutil.which("pdftotext") is None,
    reason="pdftotext is not installed (Debian/Ubuntu: apt-get install poppler-utils)",
)


@pytest.fixture
def pdf_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "papers"
    folder.mkdir()
    (folder / "safety.pdf").write_bytes(make_pdf("Everyone on site wears a hard hat."))
    (folder / "pasta.pdf").write_bytes(make_pdf("Cook the spaghetti for nine minutes."))
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not really a PDF\n")
    (folder / "notes.md").write_text("# Notes\n\nPlain Markdown loads as usual.\n")
    return folder


@needs_pdftotext
async def test_pdf_loader(pdf_folder: Path, tmp_path: Path) -> None:
    example = load_example("pdf_loader/add_pdfs.py")
    settings = yaml.safe_load(example.CONFIG_FILE.read_text(encoding="utf-8"))
    config = config_from_dict({**settings, "embeddings": HASH})
    report, results = await example.add_and_search(
        pdf_folder, "hard hat on site", db=tmp_path / "pdfs.lancedb", config=config
    )
    assert sorted(Path(uri).name for uri in report.added) == ["notes.md", "pasta.pdf", "safety.pdf"]
    [failure] = report.failed
    assert failure.uri.endswith("broken.pdf") and "pdftotext" in failure.reason
    assert results[0].document_uri.endswith("safety.pdf")
    assert "Everyone on site wears a hard hat." in results[0].content


@needs_pdftotext
def test_pdf_loader_cli(
    pdf_folder: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    example = load_example("pdf_loader/add_pdfs.py")
    settings = yaml.safe_load(example.CONFIG_FILE.read_text(encoding="utf-8"))
    config_file = tmp_path / "haiku.rag.yaml"
    config_file.write_text(yaml.safe_dump({**settings, "embeddings": HASH}), encoding="utf-8")
    monkeypatch.setattr(example, "CONFIG_FILE", config_file)
    example.main([str(pdf_folder / "pasta.pdf"), "spaghetti", "--db", str(tmp_path / "p.lancedb")])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1 added")
    assert out[1].startswith("1. file://") and "Cook the spaghetti for nine minutes." in out[1]
