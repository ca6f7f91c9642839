"""BM25 in RAM with tantivy, for drivers whose engine has no full-text search of its own.

The index is built from `(chunk_id, text, document_id)` rows, lives in memory
only, and can be updated in place (documents removed, chunks added) so a store
does not re-index everything after each write.

Text is analysed the way LanceDB's default `FTS()` index does it (simple
tokenizer, tokens of 40+ bytes dropped, lower case, English stemming, then
NLTK's English stop words, which LanceDB uses, then ASCII folding), and
tantivy's BM25 uses the same k1 = 1.2, b = 0.75, so drivers rank keyword matches
like the default driver. (tantivy's own "english" stop list is Lucene's 33 words;
with it, "it's" or "does" would match where LanceDB matches nothing.)

Queries are never parsed: they go through the same analyser and become a
disjunction of term queries. Quotes, colons, `AND`, `-` or brackets in user
input are therefore just characters, never syntax errors.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Collection, Iterable

import tantivy

from haiku.rag.store.base import Ranked

ANALYZER = "haiku_rag_en"
MAX_TOKEN_BYTES = 40
_HEAP_BYTES = 64_000_000
"""Indexing memory per thread (tantivy needs at least 15 MB; more means fewer flushes)."""
_THREADS = max(1, min(4, os.cpu_count() or 1))
_NLTK_ENGLISH = """
    i me my myself we our ours ourselves you your yours yourself yourselves he him his
    himself she her hers herself it its itself they them their theirs themselves what which
    who whom this that these those am is are was were be been being have has had having do
    does did doing a an the and but if or because as until while of at by for with about
    against between into through during before after above below to from up down in out on
    off over under again further then once here there when where why how all any both each
    few more most other some such no nor not only own same so than too very s t can will
    just don should now d ll m o re ve y ain aren couldn didn doesn hadn hasn haven isn ma
    mightn mustn needn shan shouldn wasn weren won wouldn
"""
STOP_WORDS = frozenset(_NLTK_ENGLISH.split())
"""NLTK's English stop words as LanceDB applies them (after stemming); the forms with
an apostrophe (don't, it's) never reach the filter, the tokenizer splits them."""
_TIE_MARGIN = 16
"""Extra hits fetched past `limit` so equal scores at the cut are ordered by chunk id."""


def analyzer() -> tantivy.TextAnalyzer:
    """The analyser for both indexing and queries (mirrors LanceDB's FTS defaults)."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(MAX_TOKEN_BYTES))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.stemmer("english"))
        .filter(tantivy.Filter.custom_stopword(list(STOP_WORDS)))
        .filter(tantivy.Filter.ascii_fold())
        .build()
    )


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("id", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field("document_id", tokenizer_name="raw", index_option="basic")
    builder.add_text_field("content", tokenizer_name=ANALYZER, index_option="freq")
    return builder.build()


class KeywordIndex:
    """An in-memory BM25 index over chunk text, filterable by document id."""

    def __init__(self, rows: Iterable[tuple[str, str, str]] = ()) -> None:
        self._schema = _schema()
        self._analyzer = analyzer()
        self._index = tantivy.Index(self._schema)
        self._index.register_tokenizer(ANALYZER, self._analyzer)
        self._lock = threading.Lock()
        self._size = 0
        self.update(add=rows)

    def __len__(self) -> int:
        return self._size

    def update(
        self, *, remove_documents: Collection[str] = (), add: Iterable[tuple[str, str, str]] = ()
    ) -> None:
        """Drop every chunk of `remove_documents`, then index `add` rows, in one commit."""
        with self._lock:
            # Several indexing threads (100k chunks of ~450 characters: 2.4 s with one,
            # 1.5 s with two). Each makes its own segment; BM25 statistics are summed
            # over segments, so scores do not depend on how the rows were split.
            writer = self._index.writer(_HEAP_BYTES * _THREADS, _THREADS)
            for document_id in remove_documents:
                writer.delete_documents_by_term("document_id", document_id)
            for chunk_id, text, document_id in add:
                writer.add_document(
                    tantivy.Document(id=chunk_id, document_id=document_id, content=text)
                )
            writer.commit()
            writer.wait_merging_threads()
            self._index.reload()
            self._size = self._index.searcher().num_docs

    def terms(self, query: str) -> list[str]:
        """The query's terms after analysis (empty when it has only stop words or symbols)."""
        return list(self._analyzer.analyze(query))

    def search(self, query: str, limit: int, document_ids: Collection[str] | None = None) -> Ranked:
        """`(chunk_id, bm25)` best first, ties by chunk id; any text is a valid query."""
        terms = self.terms(query)
        if limit <= 0 or not terms or (document_ids is not None and not document_ids):
            return []
        text_query = tantivy.Query.boolean_query(
            [
                (tantivy.Occur.Should, tantivy.Query.term_query(self._schema, "content", term))
                for term in terms
            ]
        )
        if document_ids is not None:
            # Boost 0: the filter selects documents without adding to their score, so a
            # filtered search scores chunks exactly like an unfiltered one.
            allowed = tantivy.Query.boost_query(
                tantivy.Query.term_set_query(self._schema, "document_id", list(document_ids)),
                0.0,
            )
            text_query = tantivy.Query.boolean_query(
                [(tantivy.Occur.Must, text_query), (tantivy.Occur.Must, allowed)]
            )
        searcher = self._index.searcher()
        hits = searcher.search(text_query, limit + _TIE_MARGIN, count=False).hits
        ranked = [(searcher.doc(address)["id"][0], float(score)) for score, address in hits]
        ranked.sort(key=lambda pair: (-pair[1], pair[0]))
        return ranked[:limit]


__all__ = ["ANALYZER", "STOP_WORDS", "KeywordIndex", "analyzer"]
