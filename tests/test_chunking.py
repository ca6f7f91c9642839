"""The recursive splitter: verbatim slices, size bound, overlap, Markdown structure."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from haiku.rag.chunking import (
    CODE_SEPARATORS,
    MARKDOWN_SEPARATORS,
    PLAIN_SEPARATORS,
    PYTHON_SEPARATORS,
    chunk_document,
    default_overlap,
    looks_like_markdown,
    markdown_headings_at,
    separators_for,
    split_text,
)
from haiku.rag.documents import Document, chunk_id_for

WORDS = ["lance", "vector", "index", "query", "bm25", "fusion", "rank", "chunk", "embed"]
WORDS += ["the", "a", "of", "and", "to"]


def random_text(rng: random.Random, length: int) -> str:
    """Prose, headings, fences with '#' comments, blank lines and unbreakable tokens."""
    parts: list[str] = []
    total = 0
    while total < length:
        roll = rng.random()
        if roll < 0.05:
            parts.append(f"\n{'#' * rng.randint(1, 4)} {rng.choice(WORDS).title()}\n")
        elif roll < 0.08:
            body = "\n".join(f"# {rng.choice(WORDS)}\nx = {i}" for i in range(rng.randint(1, 6)))
            parts.append(f"\n```python\n{body}\n```\n")
        elif roll < 0.12:
            parts.append("\n\n")
        elif roll < 0.15:
            parts.append(". ")
        elif roll < 0.17:
            parts.append("z" * rng.randint(20, 300))  # longer than some sizes: hard cuts
        elif roll < 0.19:
            parts.append(rng.choice(["\n", "  ", "\t", "\r\n"]))
        else:
            parts.append(rng.choice(WORDS) + " ")
        total += len(parts[-1])
    return "".join(parts)[:length]


def assert_well_formed(text: str, chunks: list[tuple[int, str]], size: int) -> None:
    """The invariants every split must keep, whatever the input."""
    covered = bytearray(len(text))
    previous_start = -1
    for start, chunk in chunks:
        assert text[start : start + len(chunk)] == chunk
        assert 0 < len(chunk) <= size
        assert chunk == chunk.strip()
        assert start > previous_start
        previous_start = start
        covered[start : start + len(chunk)] = b"\x01" * len(chunk)
    missed = [i for i, char in enumerate(text) if not char.isspace() and not covered[i]]
    assert not missed, f"characters not in any chunk: {missed[:10]}"


@pytest.mark.parametrize("seed", range(60))
def test_random_texts_keep_every_invariant(seed: int):
    rng = random.Random(seed)
    text = random_text(rng, rng.randint(0, 3000))
    size = rng.choice([1, 2, 7, 25, 80, 200, 500, 2000])
    overlap = rng.randint(0, size - 1) if rng.random() < 0.8 else 0
    separators = rng.choice(
        [MARKDOWN_SEPARATORS, PLAIN_SEPARATORS, PYTHON_SEPARATORS, CODE_SEPARATORS, ()]
    )
    chunks = split_text(text, size, overlap, separators)
    assert_well_formed(text, chunks, size)
    assert chunks == split_text(text, size, overlap, separators)  # deterministic


@pytest.mark.parametrize("seed", range(20))
def test_chunk_document_slices_the_document(seed: int):
    rng = random.Random(1000 + seed)
    uri = rng.choice(["notes.md", "notes.txt", "script.py", "page.ts", "https://x.org/doc"])
    document = Document.from_text(random_text(rng, rng.randint(1, 4000)), uri=uri)
    size = rng.choice([50, 300, 1000])
    chunks = chunk_document(document, size, default_overlap(size))
    for order, chunk in enumerate(chunks):
        assert document.content[chunk.start : chunk.start + len(chunk.content)] == chunk.content
        assert len(chunk.content) <= size
        assert chunk.order == order
        assert chunk.document_id == document.id
        assert chunk.id == chunk_id_for(document.id, order, chunk.content)
    assert_well_formed(document.content, [(c.start, c.content) for c in chunks], size)


def test_empty_and_blank_text_give_no_chunks():
    assert split_text("", 100, 10, PLAIN_SEPARATORS) == []
    assert split_text(" \n\n\t ", 100, 10, PLAIN_SEPARATORS) == []
    assert chunk_document(Document.from_text("", uri="empty.md"), 100, 5) == []


def test_text_shorter_than_size_is_one_chunk():
    text = "\n  LanceDB stores vectors.\n\nIt has full-text search too.  \n"
    assert split_text(text, 2000, 100, PLAIN_SEPARATORS) == [(3, text.strip())]


def test_overlap_carries_the_end_of_the_previous_chunk_at_a_word_start():
    rng = random.Random(7)
    text = " ".join(rng.choice(WORDS) for _ in range(2000))
    size, overlap = 200, 40
    chunks = split_text(text, size, overlap, PLAIN_SEPARATORS)
    assert len(chunks) > 10
    longest_word = max(map(len, WORDS))
    for (start, chunk), (next_start, _) in itertools.pairwise(chunks):
        shared = start + len(chunk) - next_start
        assert overlap - longest_word - 1 <= shared <= overlap
        assert text[next_start - 1] == " "  # the overlap starts at a word, not inside one


def test_overlap_without_spaces_is_a_hard_cut():
    text = "x" * 100
    chunks = split_text(text, 30, 10, PLAIN_SEPARATORS)
    assert [start for start, _ in chunks] == [0, 20, 40, 60, 80]
    assert all(len(chunk) <= 30 for _, chunk in chunks)


def test_zero_overlap_chunks_do_not_share_text():
    text = " ".join(["alpha beta gamma delta"] * 50)
    chunks = split_text(text, 60, 0, PLAIN_SEPARATORS)
    for (start, chunk), (next_start, _) in itertools.pairwise(chunks):
        assert start + len(chunk) <= next_start


def test_no_separator_found_cuts_hard():
    assert split_text("abcdefghij" * 3, 12, 0, []) == [
        (0, "abcdefghijab"),
        (12, "cdefghijabcd"),
        (24, "efghij"),
    ]


def test_sentence_separator_keeps_the_full_stop_with_its_sentence():
    text = "First sentence here. Second sentence here. Third one is here. Fourth one."
    chunks = split_text(text, 45, 0, [". ", ""])
    assert [chunk for _, chunk in chunks] == [
        "First sentence here. Second sentence here.",
        "Third one is here. Fourth one.",
    ]


def test_paragraphs_are_preferred_over_lines_and_words():
    text = "para one line one\npara one line two\n\npara two line one\npara two line two"
    chunks = split_text(text, 40, 0, PLAIN_SEPARATORS)
    assert [chunk for _, chunk in chunks] == [
        "para one line one\npara one line two",
        "para two line one\npara two line two",
    ]


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (-5, 0), (10, 10), (10, -1)])
def test_invalid_size_or_overlap_is_rejected(size: int, overlap: int):
    with pytest.raises(ValueError, match="chunk"):
        split_text("some text", size, overlap, PLAIN_SEPARATORS)


def test_default_overlap_is_five_percent():
    assert default_overlap(2000) == 100
    assert default_overlap(1000) == 50
    assert default_overlap(10) == 0


MANUAL = """# Manual

Intro to the tool, short.

## Install

Install it with pip. {install}

### From source

Clone the repository and build it. {source}

```python
# Configure the build
# Not a heading, a comment
import os
print(os.name)
```

## Usage

Run the command. {usage}
"""


def manual() -> str:
    filler = "Words about this part of the manual go on and on. "
    return MANUAL.format(install=filler * 8, source=filler * 6, usage=filler * 8)


def test_markdown_chunks_keep_their_heading_path():
    document = Document.from_text(manual(), uri="docs/manual.md")
    chunks = chunk_document(document, 300, 15)
    by_text = {chunk.content.split("\n")[0]: chunk.headings for chunk in chunks}
    assert by_text["# Manual"] == ["Manual"]
    assert by_text["## Install"] == ["Manual", "Install"]
    assert by_text["### From source"] == ["Manual", "Install", "From source"]
    assert by_text["## Usage"] == ["Manual", "Usage"]
    code = next(chunk for chunk in chunks if "import os" in chunk.content)
    assert code.headings == ["Manual", "Install", "From source"]
    assert all(
        chunk.headings[-1] in {"Manual", "Install", "From source", "Usage"} for chunk in chunks
    )


def test_headings_start_chunks_and_get_no_overlap():
    text = manual()
    chunks = split_text(text, 300, 15, MARKDOWN_SEPARATORS)
    starts = {start for start, _ in chunks}
    for heading in ("\n## Install", "\n### From source", "\n## Usage"):
        assert text.index(heading) + 1 in starts
    for _, chunk in chunks:
        if chunk.startswith("#"):
            assert chunk.split("\n")[0] in {
                "# Manual",
                "## Install",
                "### From source",
                "## Usage",
            }


def test_each_section_longer_than_half_the_size_starts_its_own_chunk():
    sections = [f"## Part {i}\n\n" + f"part {i} text " * 12 for i in range(6)]
    text = "\n\n".join(sections)
    chunks = split_text(text, 200, 20, MARKDOWN_SEPARATORS)
    assert [chunk.split("\n")[0] for _, chunk in chunks] == [f"## Part {i}" for i in range(6)]


def test_deep_headings_after_blank_lines_are_clean_breaks_too():
    sections = [f"##### Step {i}\n\n" + f"step {i} words " * 10 for i in range(4)]
    text = "Intro sentence. " * 4 + "\n\n\n\n" + "\n\n\n\n".join(sections)
    chunks = split_text(text, 160, 30, MARKDOWN_SEPARATORS)
    assert [chunk.split("\n")[0] for _, chunk in chunks] == [
        "Intro sentence. " * 3 + "Intro sentence.",
        *(f"##### Step {i}" for i in range(4)),
    ]


def test_a_deep_heading_before_a_long_body_moves_to_the_body():
    text = "Intro sentence. " * 4 + "\n\n##### Long step\n\n" + "many words here. " * 30
    chunks = split_text(text, 160, 30, MARKDOWN_SEPARATORS)
    assert chunks[0][1] == ("Intro sentence. " * 4).strip()
    assert chunks[1][1].startswith("##### Long step\n\nmany words here.")


def test_small_sections_share_a_chunk():
    text = "# A\n\none\n\n## B\n\ntwo\n\n## C\n\nthree"
    assert split_text(text, 100, 10, MARKDOWN_SEPARATORS) == [(0, text)]


def test_heading_stays_with_its_text_when_the_section_is_split():
    text = "## Long section\n\n" + "sentence about things. " * 30
    chunks = split_text(text, 120, 10, MARKDOWN_SEPARATORS)
    assert chunks[0][1].startswith("## Long section\n\nsentence about things.")


def test_fenced_code_is_not_split_on_comment_lines():
    code = "\n".join(f"# step {i}\nvalue_{i} = compute({i})" for i in range(8))
    text = f"# Guide\n\nSome prose before the code block.\n\n```python\n{code}\n```\n\nAfter."
    chunks = split_text(text, 260, 0, MARKDOWN_SEPARATORS)
    fenced = [chunk for _, chunk in chunks if "```python" in chunk]
    assert len(fenced) == 1 and fenced[0].startswith("```python") and fenced[0].endswith("```")
    assert not any(chunk.startswith("# step") for _, chunk in chunks)
    headings_at = markdown_headings_at(text)
    assert headings_at(text.index("# step 3")) == ["Guide"]


def test_fenced_code_too_big_for_a_chunk_is_split_by_lines():
    code = "\n".join(f"# step {i}\nvalue_{i} = compute({i})" for i in range(30))
    text = f"Intro.\n\n```python\n{code}\n```\n"
    chunks = split_text(text, 120, 0, MARKDOWN_SEPARATORS)
    assert_well_formed(text, chunks, 120)
    assert len(chunks) > 5


def test_markdown_headings_at_follows_levels():
    text = "# A\ntext\n## B\ntext\n### C\ntext\n## D ##\ntext\n# E\n"
    headings_at = markdown_headings_at(text)
    assert headings_at(0) == ["A"]
    assert headings_at(text.index("### C") - 1) == ["A", "B"]
    assert headings_at(text.index("### C")) == ["A", "B", "C"]
    assert headings_at(text.index("## D") + 8) == ["A", "D"]
    assert headings_at(len(text)) == ["E"]
    assert markdown_headings_at("no headings\n#hashtag\n")(5) == []


def test_headings_ignore_every_kind_of_fence():
    text = (
        "# Top\n~~~\n# tilde comment\n~~~\n````\n```\n# nested\n```\n````\n"
        "```inline` code\n## Real\n```\n# unclosed fence\n"
    )
    headings_at = markdown_headings_at(text)
    assert headings_at(text.index("# tilde")) == ["Top"]
    assert headings_at(text.index("# nested")) == ["Top"]
    assert headings_at(text.index("## Real")) == ["Top", "Real"]
    assert headings_at(len(text) - 1) == ["Top", "Real"]


def test_separators_follow_the_file_type():
    assert separators_for("docs/guide.md") == MARKDOWN_SEPARATORS
    assert separators_for("https://example.com/README.markdown?x=1") == MARKDOWN_SEPARATORS
    assert separators_for("C:\\work\\notes.MD") == MARKDOWN_SEPARATORS
    assert separators_for("src/app.py") == PYTHON_SEPARATORS
    assert separators_for("src/app.ts") == CODE_SEPARATORS
    assert separators_for("notes.txt") == PLAIN_SEPARATORS
    assert separators_for("notes.txt", "just some words\n\nmore words") == PLAIN_SEPARATORS
    page = "# Title\n\nSee [the docs](https://example.com).\n"
    assert separators_for("https://example.com/page", page) == MARKDOWN_SEPARATORS
    assert separators_for("notes.txt", "# One\n\n## Two\n") == MARKDOWN_SEPARATORS


def test_markdown_sniffing():
    assert looks_like_markdown("```\ncode\n```\n")
    assert looks_like_markdown("# A\n\n## B\n")
    assert not looks_like_markdown("# just one comment line\nplain text")
    assert not looks_like_markdown("Plain prose with a [bracket] and (parens).")


def test_python_files_split_at_definitions():
    functions = [f"def function_{i}(x):\n    return x + {i}\n" for i in range(6)]
    text = "import os\n\n\n" + "\n\n".join(functions)
    document = Document.from_text(text, uri="module.py")
    chunks = chunk_document(document, 50, 0)
    assert all(chunk.headings == [] for chunk in chunks)
    assert [chunk.content for chunk in chunks] == [
        "import os\n\n\n" + functions[0].strip(),
        *(function.strip() for function in functions[1:]),
    ]


def test_crlf_and_unicode_text_keep_the_invariant():
    text = "Überschrift\r\n\r\nÄpfel und Birnen. 日本語のテキスト。\r\n" * 40
    chunks = split_text(text, 64, 8, PLAIN_SEPARATORS)
    assert_well_formed(text, chunks, 64)


def test_large_document_is_fast_enough():
    rng = random.Random(3)
    text = random_text(rng, 400_000)
    chunks = split_text(text, 2000, 100, MARKDOWN_SEPARATORS)
    assert_well_formed(text, chunks, 2000)
    assert re.search(r"\S", chunks[-1][1])
