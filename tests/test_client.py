from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from haiku.rag import HaikuRAG, StoreError, StoreNotFoundError
from haiku.rag.client import plan_chunking, resolve_db_path, uri_matches
from haiku.rag.config import AppConfig, config_from_dict
from haiku.rag.embeddings import EmbeddingService


class CountingProgress:
    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self.done: dict[str, int] = {}

    def start(self, task: str, total: int) -> None:
        self.totals[task] = total
        self.done[task] = 0

    def advance(self, task: str, amount: int = 1) -> None:
        self.done[task] += amount


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "kb.lancedb"


async def test_missing_store_without_create_is_a_clear_error(db: Path, config: AppConfig):
    with pytest.raises(StoreNotFoundError, match=r"kb\.lancedb"):
        async with HaikuRAG(db, config):
            pass


async def test_add_search_and_incremental_readd(db: Path, config: AppConfig, corpus: Path):
    async with HaikuRAG(db, config, create=True) as kb:
        progress = CountingProgress()
        report = await kb.add(str(corpus), progress=progress)
        assert len(report.added) == 5 and not report.failed
        assert report.chunks_embedded >= 5
        assert progress.done["chunks"] == progress.totals["chunks"] == report.chunks_embedded
        assert progress.done["documents"] == 5

        results = await kb.search("full-text search engine written in Rust")
        assert results[0].document_uri.endswith("tantivy.md")
        assert [r.rank for r in results] == list(range(1, len(results) + 1))
        assert len(results) <= 5
        assert {"vector", "bm25"} & set(results[0].signal_ranks)

        again = await kb.add(str(corpus))
        assert len(again.unchanged) == 5 and again.chunks_embedded == 0
        assert "nothing to embed" in again.summary()


async def test_changed_and_removed_files(db: Path, config: AppConfig, corpus: Path):
    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus))
        (corpus / "tantivy.md").write_text("# Tantivy\n\nNow about compaction of segments.\n")
        (corpus / "cooking" / "bread.txt").unlink()
        report = await kb.add(str(corpus))
        assert [Path(u).name for u in report.updated] == ["tantivy.md"]
        assert [Path(u).name for u in report.deleted] == ["bread.txt"]
        assert len(report.unchanged) == 3
        assert report.chunks_embedded == 1
        documents = {Path(d.uri).name: d for d in await kb.list_documents()}
        assert len(documents) == 4
        assert documents["tantivy.md"].created_at < documents["tantivy.md"].updated_at
        hits = await kb.search("segments compaction", top_k=1)
        assert hits[0].document_uri.endswith("tantivy.md")


async def test_no_prune_keeps_vanished_documents(db: Path, config: AppConfig, corpus: Path):
    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus))
        (corpus / "cooking" / "bread.txt").unlink()
        report = await kb.add(str(corpus), prune=False)
        assert report.deleted == []
        assert len(await kb.list_documents()) == 5


async def test_single_file_spec_does_not_prune_siblings(db: Path, config, corpus: Path):
    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus))
        report = await kb.add(str(corpus / "lancedb.md"))
        assert report.deleted == [] and len(report.unchanged) == 1


async def test_failure_mid_add_keeps_previous_content(
    db: Path, config: AppConfig, corpus: Path, monkeypatch
):
    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus))
        before = {d.uri: d.content_hash for d in await kb.list_documents()}
        (corpus / "tantivy.md").write_text("# Tantivy\n\nChanged text.\n")

        async def explode(*args, **kwargs):
            raise RuntimeError("embedding service went away")

        monkeypatch.setattr(EmbeddingService, "embed_documents", explode)
        with pytest.raises(RuntimeError, match="went away"):
            await kb.add(str(corpus))
        after = {d.uri: d.content_hash for d in await kb.list_documents()}
        assert after == before
        hits = await kb.search("full-text search engine written in Rust", top_k=1)
        assert hits[0].document_uri.endswith("tantivy.md")


async def test_add_text_get_delete_and_filter(db: Path, config: AppConfig, corpus: Path):
    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus))
        doc = await kb.add_text("Zebras graze on the savanna.", uri="notes://zebra", title="Z")
        assert (await kb.get_document(doc.id)).title == "Z"
        assert (await kb.get_document("notes://zebra")).id == doc.id
        by_path = await kb.get_document(str(corpus / "lancedb.md"))
        assert by_path is not None and by_path.title == "LanceDB"

        cooking = await kb.search("water", filter="*cooking*")
        assert cooking and all("cooking" in r.document_uri for r in cooking)
        assert await kb.search("water", filter="no-such-thing") == []

        assert await kb.delete_document("notes://zebra")
        assert not await kb.delete_document("notes://zebra")
        assert await kb.get_document(doc.id) is None


async def test_rebuild_reembeds_everything(db: Path, config: AppConfig, corpus: Path):
    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus))
        chunks = (await kb.info()).chunks
        assert await kb.rebuild() == chunks
        assert (await kb.info()).chunks == chunks


async def test_reopen_and_info(db: Path, config: AppConfig, corpus: Path):
    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus))
    async with HaikuRAG(db, config, read_only=True) as kb:
        info = await kb.info()
        assert (info.documents, info.driver) == (5, "lancedb")
        assert info.embedding_model == "hash:v1" and info.embedding_dim == 256
        assert info.signals == ["vector", "bm25"]
        assert info.chunk_size == 2000 and info.chunk_overlap == 100
        assert not info.read_only  # the driver can write, although this handle may not


async def test_other_embedding_model_is_a_clear_error(db: Path, config: AppConfig, corpus):
    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus))
    other = config_from_dict({"embeddings": {"model": "hash:v2", "dimension": 256}})
    with pytest.raises(StoreError, match=r"built with embedding model 'hash:v1'.*set embeddings"):
        async with HaikuRAG(db, other):
            pass
    wrong_dim = config_from_dict({"embeddings": {"model": "hash:v1", "dimension": 128}})
    with pytest.raises(StoreError, match=r"256-dimensional.*128"):
        async with HaikuRAG(db, wrong_dim):
            pass


async def test_store_model_wins_when_config_is_silent(db: Path, config: AppConfig, corpus):
    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus))
    async with HaikuRAG(db, AppConfig()) as kb:  # default model is MiniLM; store says hash
        assert kb.embedder.model_name == "hash:v1"
        assert (await kb.search("Rust search engine", top_k=1))[0].document_uri.endswith(
            "tantivy.md"
        )


async def test_not_open_is_a_clear_error(db: Path, config: AppConfig):
    kb = HaikuRAG(db, config, create=True)
    with pytest.raises(Exception, match="not open"):
        await kb.search("x")
    await kb.open()
    assert await kb.open() is kb
    kb.close()
    kb.close()
    shutil.rmtree(db)


def test_resolve_db_path(monkeypatch, config: AppConfig, tmp_path: Path):
    assert resolve_db_path("x.lancedb", config) == Path("x.lancedb")
    monkeypatch.setenv("HAIKU_RAG_DB", str(tmp_path / "env.lancedb"))
    assert resolve_db_path(None, config) == tmp_path / "env.lancedb"
    monkeypatch.delenv("HAIKU_RAG_DB")
    assert resolve_db_path(None, config) == config.storage.data_dir / "haiku.rag.lancedb"


def test_plan_chunking_respects_embedder_window_and_user_choice():
    assert plan_chunking(AppConfig(), None).size == 2000
    capped = plan_chunking(AppConfig(), 1000)
    assert (capped.size, capped.overlap) == (1000, 50) and "window" in capped.reason
    user = config_from_dict({"chunking": {"size": 3000, "overlap": 10}})
    assert (plan_chunking(user, 1000).size, plan_chunking(user, 1000).overlap) == (3000, 10)


def test_uri_matches():
    assert uri_matches("file:///a/Cooking/x.md", "*cooking*")
    assert uri_matches("file:///a/cooking/x.md", "COOKING")
    assert not uri_matches("file:///a/b.md", "*.txt")


async def test_unreadable_file_keeps_its_stored_version(db: Path, config: AppConfig, corpus):
    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus))
        (corpus / "tantivy.md").write_bytes(b"\x00binary now")
        report = await kb.add(str(corpus))
        assert [Path(f.uri).name for f in report.failed] == ["tantivy.md"]
        assert report.deleted == []
        assert len(await kb.list_documents()) == 5


async def test_directory_does_not_prune_files_of_other_types(db: Path, config, corpus: Path):
    (corpus / "data.csv").write_text("name,value\nalpha,1\n")
    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus / "data.csv"))
        report = await kb.add(str(corpus))
        assert report.deleted == [] and len(report.added) == 5
        assert len(await kb.list_documents()) == 6


async def test_big_adds_end_with_driver_maintenance(db: Path, config, corpus, monkeypatch):
    import haiku.rag.client as client_module

    monkeypatch.setattr(client_module, "OPTIMIZE_AFTER_CHUNKS", 1)
    calls = []
    async with HaikuRAG(db, config, create=True) as kb:
        original = kb.store.optimize  # type: ignore[attr-defined]
        monkeypatch.setattr(kb.store, "optimize", lambda: calls.append(original()))
        await kb.add(str(corpus))
        assert len(calls) == 1 and calls[0].chunks >= 5
        await kb.add(str(corpus))  # nothing embedded: no maintenance
        assert len(calls) == 1


async def test_read_only_refuses_writes_before_any_work(db: Path, config, corpus, monkeypatch):
    from haiku.rag import ReadOnlyError

    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus))

    async def must_not_embed(*args, **kwargs):
        raise AssertionError("embedded although the store is read-only")

    monkeypatch.setattr(EmbeddingService, "embed_documents", must_not_embed)
    async with HaikuRAG(db, config, read_only=True) as kb:
        for write in (
            kb.add(str(corpus)),
            kb.add_text("x"),
            kb.rebuild(),
            kb.delete_document("anything"),
        ):
            with pytest.raises(ReadOnlyError, match="opened read-only"):
                await write
        assert (await kb.info()).documents == 5


def test_unknown_store_suffix_is_a_clear_error(tmp_path: Path, config: AppConfig):
    with pytest.raises(StoreError, match=r"Cannot tell the storage driver.*kb\.txt.*--driver"):
        HaikuRAG(tmp_path / "kb.txt", config)
    assert HaikuRAG(tmp_path / "kb", config).driver == "lancedb"
    assert HaikuRAG(tmp_path / "kb.txt", config, driver="yaml").driver == "yaml"


async def test_paths_filters_and_dates_behave_as_users_expect(
    db: Path, config: AppConfig, corpus: Path, monkeypatch
):
    monkeypatch.chdir(corpus.parent)
    async with HaikuRAG(db, config, create=True) as kb:
        report = await kb.add(corpus / "cooking")  # a Path, not only a str
        assert len(report.added) == 2
        hits = await kb.search("water", filter="corpus/cooking/*.md")  # relative glob
        assert [Path(h.document_uri).name for h in hits] == ["pasta.md"]

        (corpus / "cooking" / "pasta.md").unlink()  # gone from disk, still found by path
        assert await kb.get_document("corpus/cooking/pasta.md") is not None
        assert await kb.delete_document("corpus/cooking/pasta.md")

        first = await kb.add_text("one", uri="note:1")
        second = await kb.add_text("two", uri="note:1")
        assert second.created_at == first.created_at
        assert (await kb.get_document("note:1")).created_at == first.created_at


async def test_changed_chunking_setting_warns_instead_of_being_ignored(
    db: Path, config: AppConfig, corpus: Path
):
    async with HaikuRAG(db, config, create=True) as kb:
        await kb.add(str(corpus))
    resized = config.model_copy(
        update={"chunking": config.chunking.model_copy(update={"size": 300})}
    )
    with pytest.warns(UserWarning, match=r"chunking\.size is 300.*built with 2000.*new store"):
        async with HaikuRAG(db, resized) as kb:
            assert (await kb.info()).chunk_size == 2000
