"""Citation policy: a final answer may not end a question whose citation status is `missing`.

    agent = Agent(model, capabilities=[rag(db_path=...), policy.create_capability()])

When the model is about to finish with evidence retrieved but not declared (no
`cite` call newer than the latest retrieval), the policy sends it back once with
a retry prompt asking it to cite (or to `cite([])` when the documents do not
answer). If the next final answer is still `missing`, the answer goes through and
a violation is recorded on the question's evidence entry, where audits find it.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ModelRetry

from haiku.rag.capabilities.ledger import entry_status
from haiku.rag.capabilities.state import find_state

if TYPE_CHECKING:
    from pydantic_ai.output import OutputContext

REMINDER = (
    "Before answering, register the evidence your answer rests on: call `cite` with the "
    "chunk_ids you used (after your last search), or `cite([])` if the knowledge base does "
    "not support an answer. Then answer again."
)
VIOLATION = "final answer given with citation status 'missing' after a reminder"


@dataclass
class CitationPolicy(AbstractCapability[Any]):
    """Sends an uncited final answer back once, then records a violation."""

    _: KW_ONLY

    id: str | None = "haiku_rag_policy"

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def after_output_process(
        self, ctx: RunContext[Any], *, output_context: OutputContext, output: Any
    ) -> Any:
        # This hook sees every final output (text or structured), after it is validated.
        if ctx.partial_output:
            return output
        state = find_state(ctx)
        entry = state.current_evidence if state is not None else None
        if entry is None or entry_status(entry) != "missing":
            return output
        if not entry.reminded:
            entry.reminded = True
            raise ModelRetry(REMINDER)
        entry.violations.append(VIOLATION)
        return output


def create_capability() -> CitationPolicy:
    """The citation policy; use it next to the RAG capability, which owns the state."""
    return CitationPolicy()
