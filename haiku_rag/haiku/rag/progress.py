"""Progress reporting for long work, decoupled from any terminal library.

The client calls these hooks; the CLI passes an implementation backed by rich
progress bars, library users pass their own or nothing.
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def start(self, task: str, total: int) -> None:
        """A phase begins (`task` is e.g. "documents", "chunks") with `total` units."""
        ...

    def advance(self, task: str, amount: int = 1) -> None: ...


class NoProgress:
    """The default: report nothing."""

    def start(self, task: str, total: int) -> None:
        pass

    def advance(self, task: str, amount: int = 1) -> None:
        pass
