"""Sources that run a program: document loaders and backtick commands.

**Loaders** are configured commands (`document_loaders: {pdf: "pdftotext $1 -"}`)
that turn something haiku.rag cannot read (a PDF, an archive, a ticket id) into
text. A spec `pdf:report.pdf` runs the loader named `pdf`; so does any file whose
extension is a loader name (`report.pdf`), also inside directories and globs.

- `$1` is the input (the absolute path when it names an existing file or
  directory, otherwise the text after `name:` as typed); `$2`, when the template
  uses it, is a fresh temporary file the program writes its output to, otherwise
  the output is its stdout.
- Without a shell: the template is split like a shell would (`shlex`) and `$1`/`$2`
  replace whole arguments, so no file name can inject anything. A template that
  starts with `sh -c SCRIPT` or `bash -c SCRIPT` runs SCRIPT in that shell with the
  values as positional arguments (`"$1"`, `"$2"` in the script, quoted by its author).
- Secrets are written `{{NAME}}` and filled from the environment when the loader
  runs, never stored: metadata, document text and error messages show `{{NAME}}`
  in place of the value. (Outside a shell they are filled into the argument, which
  other local users can see in the process list; inside `sh -c` they become
  `${NAME}` and are expanded by the shell from the environment.)
- Output: a JSON array `[{"path", "contents", "metadata"?}]` is one document per
  entry, with uri `<input uri>#<path>`; anything else is one document whose uri
  is the input's (`file:///abs/report.pdf`, or `name:input` when the input is not
  a path). The input uri owns its entries, so entries that disappear are pruned.
- A timeout (`loader_timeout`, 120 s), a non-zero exit, a missing program or
  output that is not text is a `SourceError` naming the loader and the command.

**Backtick commands** (`` `git diff` ``) run through the shell (`/bin/sh -c`, as
the user typed them, pipes and all) with the same timeout; the output is one
document with uri `cmd:<command>`. Because a spec could come from an agent or a
server rather than a person, they only run where the caller opts in
(`CommandPolicy(allow_commands=True)`, `HaikuRAG.add(..., allow_commands=True)`;
the CLI does, since its user typed the spec).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from haiku.rag.documents import Document
from haiku.rag.errors import SourceError
from haiku.rag.sources.html import decode_text, markdown_title
from haiku.rag.sources.spec import CommandSpec, LoaderSpec, Scope

if TYPE_CHECKING:
    from haiku.rag.config import AppConfig

DEFAULT_TIMEOUT = 120.0
RESERVED_NAMES = frozenset({"http", "https", "file"})
"""Spec prefixes that already mean something; single letters are Windows drives."""
LOADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_+-]+")
SECRET = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")
SHELLS = frozenset({"sh", "bash"})
_SHELL_ARG = re.compile(r"\$(?:\{(\d+)\}|(\d+))")
STDERR_TAIL_LINES = 8
STDERR_TAIL_CHARS = 800


# ---------------------------------------------------------------------- templates


@dataclass(frozen=True)
class LoaderTemplate:
    """A validated loader: its argv tokens (placeholders not yet filled) and what it uses."""

    name: str
    template: str
    argv: tuple[str, ...]
    shell: bool
    """`sh -c SCRIPT` / `bash -c SCRIPT`: values go in as positional arguments."""
    uses_output: bool
    """The template names `$2`: read the output from a temporary file, not stdout."""
    secrets: tuple[str, ...]

    @property
    def suffix(self) -> str:
        """The file extension this loader claims (`.pdf` for `pdf`), lower case."""
        return "." + self.name.lower()


def parse_loader(name: str, template: str) -> LoaderTemplate:
    """Check a loader's name and template; raises ValueError saying what to change.

    Done when the config is loaded, so a bad template fails before any source runs.
    """
    if not LOADER_NAME.fullmatch(name) or name.lower() in RESERVED_NAMES:
        raise ValueError(
            f"loader name {name!r} must be two or more letters, digits, '_', '+' or '-' "
            f"(starting with a letter or digit) and not one of {', '.join(sorted(RESERVED_NAMES))}"
        )
    try:
        argv = tuple(shlex.split(template))
    except ValueError as error:
        raise ValueError(f"loader {name!r}: cannot split {template!r}: {error}") from None
    if not argv:
        raise ValueError(f"loader {name!r} has an empty command")
    secrets = tuple(dict.fromkeys(SECRET.findall(template)))
    if len(argv) >= 2 and Path(argv[0]).name in SHELLS and argv[1] == "-c":
        if len(argv) != 3:
            raise ValueError(
                f"loader {name!r}: `{argv[0]} -c` takes the whole script as one quoted "
                f"argument, e.g. {argv[0]} -c 'tool \"$1\"'"
            )
        numbers = {int(a or b) for a, b in _SHELL_ARG.findall(argv[2])}
        if 1 not in numbers:
            raise ValueError(f'loader {name!r}: the script must use "$1" (the input)')
        return LoaderTemplate(name, template, argv, True, 2 in numbers, secrets)
    for token in argv:
        for placeholder in ("$1", "$2"):
            if placeholder in token and token != placeholder:
                raise ValueError(
                    f"loader {name!r}: {placeholder} must be a whole argument (got {token!r}); "
                    f"to build arguments around it, use sh -c '... \"{placeholder}\" ...'"
                )
    if "$1" not in argv:
        raise ValueError(f"loader {name!r}: the command must take the input as $1")
    return LoaderTemplate(name, template, argv, False, "$2" in argv, secrets)


@dataclass(frozen=True)
class CommandPolicy:
    """Which programs sources may run: the configured loaders, their timeout, and
    whether backtick commands are allowed (only where a person typed the spec)."""

    loaders: Mapping[str, LoaderTemplate] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT
    allow_commands: bool = False

    @classmethod
    def from_templates(
        cls,
        templates: Mapping[str, str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        allow_commands: bool = False,
    ) -> CommandPolicy:
        """From `{name: template}`; an invalid template raises SourceError."""
        try:
            loaders = {name: parse_loader(name, text) for name, text in templates.items()}
        except ValueError as error:
            raise SourceError(f"Invalid document loader: {error}") from None
        return cls(loaders, timeout, allow_commands)

    @classmethod
    def from_config(cls, config: AppConfig, *, allow_commands: bool = False) -> CommandPolicy:
        """The config's `document_loaders` and `loader_timeout` (already validated)."""
        return cls.from_templates(
            config.document_loaders, timeout=config.loader_timeout, allow_commands=allow_commands
        )

    @property
    def suffixes(self) -> tuple[str, ...]:
        """File extensions that go through a loader (a directory loads these too)."""
        return tuple(sorted(loader.suffix for loader in self.loaders.values()))

    def loader_for(self, path: Path) -> LoaderTemplate | None:
        """The loader claiming this file by its extension, if any (case-insensitive)."""
        suffix = path.suffix.lower()
        return next((lo for lo in self.loaders.values() if lo.suffix == suffix), None)


# -------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class LoaderPlan:
    """A `name:input` spec resolved: what `$1` is, and the uri its documents hang from."""

    spec: LoaderSpec
    loader: LoaderTemplate
    argument: str
    uri: str
    file: Path | None
    """The input when it is an existing file or directory."""

    @property
    def scopes(self) -> tuple[Scope, ...]:
        """The input itself and its JSON entries (`uri#...`), so vanished entries are pruned."""
        return (Scope("exact", self.uri), Scope("prefix", self.uri + "#"))


def plan_loader(spec: LoaderSpec, policy: CommandPolicy) -> LoaderPlan:
    """Resolve the input: an existing path becomes absolute (and a file uri), anything
    else is passed through as typed (a ticket id, a URL for the loader to fetch)."""
    loader = policy.loaders.get(spec.loader)
    if loader is None:  # parse_spec only makes a LoaderSpec for a configured name
        raise SourceError(f"No document loader named {spec.loader!r}; add it to document_loaders")
    path = Path(spec.argument).expanduser()
    if path.exists():
        resolved = path.resolve()
        return LoaderPlan(spec, loader, str(resolved), resolved.as_uri(), resolved)
    return LoaderPlan(spec, loader, spec.argument, f"{spec.loader}:{spec.argument}", None)


def check_command_allowed(spec: CommandSpec, policy: CommandPolicy) -> None:
    if not policy.allow_commands:
        raise SourceError(
            f"{spec.raw} is a shell command source, which is only run where a person typed "
            "it (the haiku-rag command line); from Python pass allow_commands=True to "
            "HaikuRAG.add / CommandPolicy"
        )


# ------------------------------------------------------------------------ running


def _redactor(secrets: Mapping[str, str]) -> Callable[[str], str]:
    """Replace every secret value with `{{NAME}}` (longest first, so overlaps stay hidden)."""
    pairs = sorted(((v, k) for k, v in secrets.items() if v), key=lambda p: -len(p[0]))

    def redact(text: str) -> str:
        for value, name in pairs:
            text = text.replace(value, "{{" + name + "}}")
        return text

    return redact


def _redact_value(value: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(str(k)): _redact_value(v, redact) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_value(item, redact) for item in value]
    return value


def _secret_values(loader: LoaderTemplate) -> dict[str, str]:
    values: dict[str, str] = {}
    for name in loader.secrets:
        value = os.environ.get(name)
        if value is None:
            raise SourceError(
                f"Loader {loader.name!r} needs the environment variable {name} (written "
                f"{{{{{name}}}}} in document_loaders.{loader.name}): set it before adding"
            )
        values[name] = value
    return values


def _fill(token: str, secrets: Mapping[str, str], *, shell: bool) -> str:
    if shell:  # the shell expands it from the environment: the value never enters argv
        return SECRET.sub(lambda match: "${" + match.group(1) + "}", token)
    return SECRET.sub(lambda match: secrets[match.group(1)], token)


def _tail(stderr: bytes) -> str:
    text = stderr.decode("utf-8", errors="replace").strip()
    lines = text.splitlines()[-STDERR_TAIL_LINES:]
    tail = "\n".join(lines)
    return tail[-STDERR_TAIL_CHARS:]


def _kill(process: subprocess.Popen[bytes]) -> None:
    """Kill the command and everything it started (its own process group on POSIX)."""
    try:
        if os.name == "posix":
            os.killpg(process.pid, signal.SIGKILL)
        else:  # pragma: no cover - Windows
            process.kill()
    except (ProcessLookupError, PermissionError):  # pragma: no cover - already gone
        pass
    with contextlib.suppress(subprocess.TimeoutExpired):  # a grandchild kept the pipes
        process.communicate(timeout=5)


def _execute(
    argv: list[str] | str,
    *,
    what: str,
    shown: str,
    timeout: float,
    redact: Callable[[str], str] = str,
    fix: str,
) -> bytes:
    """Run without a terminal, within `timeout`; stdout, or a SourceError naming `what`."""
    shell = isinstance(argv, str)
    try:
        process = subprocess.Popen(
            argv,
            shell=shell,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=os.name == "posix",
        )
    except FileNotFoundError:
        program = argv if isinstance(argv, str) else argv[0]
        raise SourceError(
            f"{what}: program {redact(program)!r} not found (command: {shown}); {fix}"
        ) from None
    except OSError as error:
        raise SourceError(
            f"{what}: cannot run {shown}: {redact(error.strerror or str(error))}; {fix}"
        ) from None
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(process)
        raise SourceError(
            f"{what} timed out after {timeout:g} s (command: {shown}); raise loader_timeout "
            "in the config, or check that the command ends on its own"
        ) from None
    except BaseException:  # pragma: no cover - interrupted: leave nothing running
        _kill(process)
        raise
    if process.returncode != 0:
        tail = redact(_tail(stderr))
        raise SourceError(
            f"{what} failed with exit code {process.returncode} (command: {shown})"
            + (f": {tail}" if tail else "")
        )
    return stdout


def _text(data: bytes, what: str, shown: str) -> str:
    try:
        return decode_text(data)
    except ValueError as error:
        raise SourceError(
            f"{what} produced output that is not text ({error}; command: {shown}); make it "
            "print text or Markdown"
        ) from None


def run_loader(
    loader: LoaderTemplate,
    argument: str,
    *,
    uri: str,
    file: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[Document]:
    """Run `loader` on `argument`; its documents hang from `uri`. Blocking (use a thread).

    `file` is the input on disk, when it is one: it gives the title and `mtime`.
    """
    secrets = _secret_values(loader)
    redact = _redactor(secrets)
    what = f"Loader {loader.name!r}"
    fix = f"install it or fix document_loaders.{loader.name}"
    with tempfile.TemporaryDirectory(prefix="haiku-rag-loader-") as scratch:
        output = Path(scratch) / "output"
        values = {"$1": argument, "$2": str(output)}
        if loader.shell:
            head = [loader.argv[0], "-c"]
            extra = [f"haiku-rag-{loader.name}", argument]
            extra += [str(output)] if loader.uses_output else []
            argv = [*head, _fill(loader.argv[2], secrets, shell=True), *extra]
            shown_argv = [*head, loader.argv[2], *extra]
        else:
            argv = [
                values[token] if token in values else _fill(token, secrets, shell=False)
                for token in loader.argv
            ]
            shown_argv = [values.get(token, token) for token in loader.argv]
        shown = redact(shlex.join(shown_argv))
        stdout = _execute(argv, what=what, shown=shown, timeout=timeout, redact=redact, fix=fix)
        if loader.uses_output:
            try:
                stdout = output.read_bytes()
            except FileNotFoundError:
                raise SourceError(
                    f"{what} did not write its output file $2 (command: {shown}); make the "
                    "command write there, or drop $2 to read its stdout"
                ) from None
    text = redact(_text(stdout, what, shown))
    base: dict[str, Any] = {"source": "loader", "loader": loader.name, "input": redact(argument)}
    if file is not None:
        base["path"] = str(file)
        base["mtime"] = datetime.fromtimestamp(file.stat().st_mtime, UTC).isoformat()
    entries = _json_entries(text, what)
    if entries is None:
        title = markdown_title(text) or (file.stem if file is not None else redact(argument))
        return [Document.from_text(text, uri=uri, title=title, metadata=base)]
    documents: list[Document] = []
    seen: set[str] = set()
    for path, contents, metadata in entries:
        if path in seen:
            raise SourceError(f"{what} output lists the entry path {path!r} twice")
        seen.add(path)
        extra_meta = _redact_value(metadata, redact)
        named = extra_meta.get("title")
        entry_title = named if isinstance(named, str) and named else None
        documents.append(
            Document.from_text(
                contents,
                uri=f"{uri}#{quote(path, safe='/')}",
                title=entry_title or markdown_title(contents) or PurePosixPath(path).name or path,
                metadata={**extra_meta, **base, "entry": path},
            )
        )
    return documents


def _json_entries(text: str, what: str) -> list[tuple[str, str, dict[str, Any]]] | None:
    """`[{path, contents, metadata?}]` as tuples; None when the output is plain text.

    Output is read as entries when it is a JSON array of objects that all have `path`;
    such an array with a malformed entry is an error rather than silently text.
    """
    if not text.lstrip().startswith("["):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, list) or not all(
        isinstance(item, dict) and "path" in item for item in data
    ):
        return None
    entries = []
    for index, item in enumerate(data):
        path, contents, metadata = item.get("path"), item.get("contents"), item.get("metadata")
        if not isinstance(path, str) or not path:
            problem = "'path' must be a non-empty string"
        elif not isinstance(contents, str):
            problem = "'contents' must be a string"
        elif metadata is not None and not isinstance(metadata, dict):
            problem = "'metadata' must be an object"
        else:
            entries.append((path, contents, metadata or {}))
            continue
        raise SourceError(
            f"{what} output entry {index}: {problem}; loaders that print JSON must print "
            '[{"path": ..., "contents": ..., "metadata": {...}}, ...]'
        )
    return entries


def run_command(command: str, *, timeout: float = DEFAULT_TIMEOUT) -> Document:
    """Run a backtick command through the shell; its output is one `cmd:<command>` document.

    `shell=True` on purpose: the user typed a shell command (pipes, globs, `$VARS`).
    Callers must only pass commands a person typed (see `CommandPolicy.allow_commands`).
    """
    command = command.strip()
    if not command:
        raise SourceError("Empty command source ``: put a command between the backticks")
    what = f"Command `{command}`"
    stdout = _execute(
        command,
        what=what,
        shown=command,
        timeout=timeout,
        fix="check the command in a shell",
    )
    text = _text(stdout, what, command)
    return Document.from_text(
        text,
        uri=f"cmd:{command}",
        title=markdown_title(text) or command,
        metadata={"source": "command", "command": command},
    )
