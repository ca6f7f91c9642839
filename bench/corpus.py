"""A known-item retrieval set built from the machine's own man pages.

Each page becomes one document (everything after its NAME section) and one query
(the one-line description from NAME). The query's only relevant document is its
page, so rank-based metrics measure how well retrieval finds a known item.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

MAN_DIRS = (Path("/usr/share/man/man1"), Path("/usr/share/man/man8"))
MAX_PER_FAMILY = 3
_NAME_LINE = re.compile(r"^\s*(?P<names>.+?)\s+[-\u2010-\u2014]+\s+(?P<description>.+)$")


@dataclass(frozen=True)
class KnownItem:
    name: str
    query: str
    document: str


def render(page: Path) -> str:
    env = dict(os.environ, MANWIDTH="100", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="")
    result = subprocess.run(
        ["man", "-P", "cat", "-l", str(page)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    return result.stdout


def parse(name: str, text: str) -> KnownItem | None:
    """Split a rendered page into (description, body); None when it has no usable NAME."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "NAME")
    except StopIteration:
        return None
    name_lines = []
    body_start = None
    for i in range(start + 1, len(lines)):
        if lines[i] and not lines[i].startswith(" "):
            body_start = i
            break
        if lines[i].strip():
            name_lines.append(lines[i].strip())
    if body_start is None:
        return None
    match = _NAME_LINE.match(" ".join(name_lines))
    if not match:
        return None
    description = match["description"].strip()
    body = "\n".join(line for line in lines[body_start:-1])
    if len(description.split()) < 3 or len(body) < 400:
        return None
    return KnownItem(name=name, query=description, document=body)


def _family(name: str) -> str:
    return re.split(r"[-_.]", name)[0]


def man_pages(count: int, seed: int = 7) -> list[KnownItem]:
    """`count` known items sampled deterministically from the installed man pages."""
    pages = sorted(p for d in MAN_DIRS if d.is_dir() for p in d.iterdir() if p.is_file())
    if not pages:
        raise SystemExit("No man pages under /usr/share/man: install man-db and manpages")
    rng = random.Random(seed)
    rng.shuffle(pages)
    # Tool suites (gcloud_*, git-*) ship thousands of look-alike pages: cap each
    # family before rendering so the set measures retrieval, not one vendor's boilerplate.
    per_family: dict[str, int] = {}
    candidates = []
    for page in pages:
        family = _family(page.name.split(".")[0])
        if per_family.get(family, 0) < MAX_PER_FAMILY:
            per_family[family] = per_family.get(family, 0) + 1
            candidates.append(page)
    pages = candidates
    items: list[KnownItem] = []
    seen_queries: set[str] = set()
    position = 0
    with ThreadPoolExecutor(max_workers=2) as pool:
        while len(items) < count and position < len(pages):
            window = pages[position : position + (count - len(items)) * 2]
            position += len(window)
            for page, text in zip(window, pool.map(render, window), strict=True):
                item = parse(page.name.split(".")[0], text)
                if item is None or item.query.lower() in seen_queries:
                    continue
                seen_queries.add(item.query.lower())
                items.append(item)
                if len(items) == count:
                    break
    return items
