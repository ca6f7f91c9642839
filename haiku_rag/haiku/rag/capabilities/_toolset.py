"""The toolset wrapper both capabilities hand to the agent for one run.

Tool definitions are built once per process and shared; each run gets this thin
wrapper that sends calls to that run's capability and, when the agent leaves the
toolset, releases what the run opened (client, sandbox). The agent enters and exits
its toolsets around every run, whatever happens in it (errors, cancellation, or a
deferred capability that `wrap_run` never wraps), so this is the one place cleanup
cannot be skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self

from pydantic_ai import RunContext
from pydantic_ai.toolsets import ToolsetTool, WrapperToolset


@dataclass
class RunScopedToolset(WrapperToolset[Any]):
    """Counts nested enters; the last exit releases the owner's per-run resources.
    Subclasses route `call_tool` to the owner."""

    owner: Any = None
    """The run's capability: it has `async release()` and handles the calls."""
    _entered: int = field(default=0, init=False)

    async def __aenter__(self) -> Self:
        self._entered += 1
        return self

    async def __aexit__(self, *args: Any) -> bool | None:
        self._entered -= 1
        if self._entered <= 0 and self.owner is not None:
            await self.owner.release()
        return None

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        raise NotImplementedError
