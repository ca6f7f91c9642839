"""`haiku-rag chat`: a minimal interactive loop over a knowledge base.

Each line is a question, answered by an agent with the RAG capability (search,
execute_code, cite) over the current knowledge base, with the conversation's
message history, so follow-up questions work. Commands:

    .rag NAME                   switch knowledge base: a name in the rags dir, or a path
                                (it has a `/`, a scheme or a store suffix); no NAME: show it
    .file DOC [DOC ...] -- Q    answer Q from those documents only (ephemeral, this turn);
                                `%%` is the last reply, `` `cmd` `` a command's output;
                                with one DOC and no `-- Q`, DOC's text is the question
    .exit rag                   leave the knowledge base: plain chat, no retrieval
    .help                       this list
    .exit                       quit (so does end of input, Ctrl-D)

The loop is independent of the terminal: `run_chat(read, write, ...)` takes a
`read(prompt) -> str` callable that raises `EOFError` at the end (`input` in the
CLI, `scripted(lines)` in tests) and a `write(text)` callable. A failed turn
(a missing file, a model error) prints one line and the loop goes on.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage

from haiku.rag.capabilities import compaction
from haiku.rag.capabilities.rag import create_capability as rag_capability
from haiku.rag.capabilities.state import RAGDeps, RAGState
from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig
from haiku.rag.documents import Citation, Document
from haiku.rag.errors import ConfigError, HaikuRAGError, StoreNotFoundError

ReadLine = Callable[[str], str]
"""`input`-like: shows the prompt, returns a line, raises EOFError at the end."""
Write = Callable[[str], None]

LAST_REPLY = "%%"
LAST_REPLY_URI = "chat:last-reply"
HISTORY_FILE = "chat_history"
HISTORY_LENGTH = 1000
STORE_SUFFIXES = (".lancedb", ".yaml", ".yml", ".duckdb")

HELP = """\
Commands:
  .rag NAME                  switch to another knowledge base (a name or a path)
  .file DOC ... -- QUESTION  answer from those documents only (%% = the last reply,
                             `cmd` = a command's output); one DOC alone is the question
  .exit rag                  leave the knowledge base (plain chat)
  .help                      this list
  .exit                      quit (or Ctrl-D)"""

_TOKEN = re.compile(r"`[^`]*`|\"[^\"]*\"|'[^']*'|\S+")


def scripted(lines: Iterable[str]) -> ReadLine:
    """A `read` that returns `lines` one by one, then raises EOFError (for tests, scripts)."""
    pending = iter(lines)

    def read(prompt: str) -> str:
        try:
            return next(pending)
        except StopIteration:
            raise EOFError from None

    return read


def parse_file_command(text: str) -> tuple[list[str], str | None]:
    """`.file`'s arguments -> (sources, question or None when there is no `--`).

    Sources are split on whitespace; `` `a command` `` and quoted paths stay whole
    (quotes are removed). The question is the raw text after the first lone `--`.
    """
    sources: list[str] = []
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if token == "--":
            return sources, text[match.end() :].strip()
        if len(token) >= 2 and token[0] == token[-1] and token[0] in "\"'":
            token = token[1:-1]
        sources.append(token)
    return sources, None


def source_lines(citations: list[Citation]) -> list[str]:
    """The numbered sources printed under an answer."""
    if not citations:
        return []
    lines = ["", "Sources:"]
    for citation in citations:
        title = citation.document_title or citation.document_uri
        lines.append(
            f"[{citation.index}] {title} ({citation.document_uri}, chunk {citation.chunk_id})"
        )
    return lines


def open_kb(name: str, config: AppConfig) -> HaikuRAG:
    """`.rag NAME`: a path (it has a `/`, a scheme or a store suffix) or a named
    knowledge base in the rags dir. Not opened yet."""
    if "/" in name or "://" in name or name.lower().endswith(STORE_SUFFIXES):
        location: str | Path = name if "://" in name else Path(name).expanduser()
        return HaikuRAG(location, config, read_only=True)
    return HaikuRAG.named(name, config, read_only=True)


def kb_label(kb: HaikuRAG) -> str:
    """What the prompt shows: the knowledge base's name, else its store's stem."""
    return kb.rag_name or Path(kb.location.rstrip("/")).stem


def enable_history(path: Path) -> Callable[[], None] | None:
    """Load readline history from `path`; returns the function that saves it (None
    when readline is not available, e.g. on Windows)."""
    try:
        import readline
    except ImportError:  # pragma: no cover - platform without readline
        return None
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    readline.set_history_length(HISTORY_LENGTH)

    def save() -> None:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)

    return save


@dataclass
class Chat:
    """The chat's state between lines: model, knowledge base, history, last reply."""

    config: AppConfig
    model: Any
    write: Write
    kb: HaikuRAG | None = None
    kb_name: str | None = None
    history: list[ModelMessage] = field(default_factory=list)
    last_reply: str | None = None
    state: RAGState = field(default_factory=RAGState)
    """The RAG capability's memory for the current knowledge base (citation numbers...)."""

    @property
    def prompt(self) -> str:
        return f"{self.kb_name}> " if self.kb_name else "> "

    async def handle(self, line: str) -> bool:
        """Act on one line; False when the chat should end."""
        text = line.strip()
        if not text:
            return True
        command, _, rest = text.partition(" ")
        rest = rest.strip()
        try:
            if command == ".exit":
                if rest == "rag":
                    self.leave()
                    return True
                if not rest:
                    return False
                self.write(f"Unknown command .exit {rest}: .exit quits, .exit rag leaves the KB")
            elif command == ".help":
                self.write(HELP)
            elif command == ".rag":
                await self.use(rest)
            elif command == ".file":
                await self.ask_files(rest)
            elif command.startswith(".") and len(command) > 1 and command[1].isalpha():
                self.write(f"Unknown command {command}: .help lists the commands")
            else:
                await self.ask(text)
        except HaikuRAGError as error:
            self.write(f"Error: {error}")
        except Exception as error:  # a failed turn (model, network) must not end the chat
            self.write(f"Error: {type(error).__name__}: {error}")
        return True

    async def use(self, name: str) -> None:
        """`.rag NAME`: open that knowledge base (read-only) and start a fresh RAG state."""
        if not name:
            where = f"{self.kb_name} ({self.kb.location})" if self.kb else "none (plain chat)"
            self.write(f"Knowledge base: {where}. Switch with .rag NAME")
            return
        self.switch(await open_kb(name, self.config).open())

    def switch(self, kb: HaikuRAG) -> None:
        """Use the open `kb` from now on, with a fresh RAG state (citation numbers...)."""
        self.close()
        self.kb, self.kb_name, self.state = kb, kb_label(kb), RAGState()
        self.write(f"Using knowledge base {self.kb_name} ({kb.location}).")

    def leave(self) -> None:
        """`.exit rag`: plain chat from now on; the conversation goes on."""
        if self.kb is None:
            self.write("Not using a knowledge base.")
            return
        name = self.kb_name
        self.close()
        self.write(f"Left {name}: plain chat (.rag NAME to use a knowledge base again).")

    async def ask(self, question: str) -> None:
        """A question: over the knowledge base with the RAG capability, else plain."""
        if self.kb is None:
            agent: Agent[Any, str] = Agent(self.model)
            result = await agent.run(question, message_history=self.history)
            self._answered(result.all_messages(), result.output, [])
            return
        await self._ask_rag(self.kb, self.state, question)

    async def ask_files(self, arguments: str) -> None:
        """`.file DOC ... -- question`: this turn only, from those documents."""
        from haiku.rag.ephemeral import ephemeral_kb, read_prompt

        specs, question = parse_file_command(arguments)
        if not specs:
            self.write("Usage: .file DOC [DOC ...] -- QUESTION (.help for more)")
            return
        if question is None:
            if len(specs) > 1:
                self.write("Several documents need a question: .file DOC DOC -- QUESTION")
                return
            if specs[0] == LAST_REPLY:
                prompt = self._last_reply()
            else:
                prompt = await read_prompt(specs[0], self.config, allow_commands=True)
            await self.ask(prompt)
            return
        if not question:
            self.write("No question after `--`: .file DOC ... -- QUESTION")
            return
        documents = []
        if LAST_REPLY in specs:
            documents.append(
                Document.from_text(self._last_reply(), uri=LAST_REPLY_URI, title="Last reply")
            )
        sources = [spec for spec in specs if spec != LAST_REPLY]
        async with ephemeral_kb(
            sources,
            self.config,
            documents=documents,
            on_failure=lambda failure: self.write(f"failed {failure.uri}: {failure.reason}"),
            allow_commands=True,  # typed by the person at the prompt
        ) as kb:
            await self._ask_rag(kb, RAGState(), question)

    async def _ask_rag(self, kb: HaikuRAG, state: RAGState, question: str) -> None:
        agent = Agent(
            self.model,
            capabilities=[rag_capability(rag=kb), compaction.create_capability()],
            deps_type=RAGDeps,
        )
        result = await agent.run(
            question, message_history=self.history, deps=RAGDeps(state={"rag": state})
        )
        self._answered(result.all_messages(), result.output, state.cited())

    def _answered(self, messages: list[ModelMessage], reply: str, cited: list[Citation]) -> None:
        self.history = messages
        self.last_reply = reply
        self.write(reply)
        for line in source_lines(cited):
            self.write(line)

    def _last_reply(self) -> str:
        if self.last_reply is None:
            raise HaikuRAGError(f"{LAST_REPLY} is the last reply, and there is none yet")
        return self.last_reply

    def close(self) -> None:
        kb, self.kb, self.kb_name = self.kb, None, None
        if kb is not None:
            kb.close()


async def run_chat(
    read: ReadLine,
    write: Write,
    *,
    config: AppConfig,
    model: Any = None,
    db: str | Path | None = None,
    rag_name: str | None = None,
) -> Chat:
    """Read lines until `.exit` or end of input; returns the final chat state.

    The knowledge base is `rag_name` (a named one), else `db`, else the default store.
    A named or given store that does not exist is an error; a missing default store
    starts a plain chat, with a note.
    """
    chosen = model if model is not None else config.qa.model
    if chosen is None:
        raise ConfigError(
            "No chat model for `chat`: set qa.model in the config (e.g. 'openai:gpt-5') "
            "or pass --model"
        )
    chat = Chat(config=config, model=chosen, write=write)
    try:
        await _open_start(chat, db, rag_name)
        write("haiku.rag chat: .help for commands, .exit to quit.")
        while True:
            try:
                line = read(chat.prompt)
            except EOFError:
                break
            if not await chat.handle(line):
                break
    finally:
        chat.close()
    return chat


async def _open_start(chat: Chat, db: str | Path | None, rag_name: str | None) -> None:
    """Open the knowledge base the chat starts with."""
    if rag_name is not None:
        kb = HaikuRAG.named(rag_name, chat.config, read_only=True)
    else:
        kb = HaikuRAG(db, chat.config, read_only=True)
    try:
        await kb.open()
    except StoreNotFoundError:
        if db is not None or rag_name is not None:
            raise
        chat.write(f"No knowledge base at {kb.location}: plain chat (.rag NAME to use one).")
        return
    chat.switch(kb)
