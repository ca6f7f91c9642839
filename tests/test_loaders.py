"""Document loaders (`name:input`, files by extension) and backtick command sources.

The loaders are small Python scripts run with this interpreter, so the tests need
no tool beyond a POSIX shell.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from haiku.rag.cli import app
from haiku.rag.client import HaikuRAG
from haiku.rag.config import AppConfig, config_from_dict
from haiku.rag.errors import ConfigError, SourceError
from haiku.rag.sources import CommandPolicy, load_sources
from haiku.rag.sources.loaders import (
    parse_loader,
    plan_loader,
    run_command,
    run_loader,
)
from haiku.rag.sources.spec import (
    CommandSpec,
    LoaderSpec,
    PathSpec,
    Scope,
    UrlSpec,
    parse_spec,
    split_specs,
)

PY = shlex.quote(sys.executable)

UPPER = """
import sys
print(open(sys.argv[1], encoding="utf-8").read().upper(), end="")
"""

UPPER_OR_FAIL = (
    UPPER
    + """
if not open(sys.argv[1], encoding="utf-8").read():
    sys.exit(9)
"""
)

TO_FILE = """
import sys
text = open(sys.argv[1], encoding="utf-8").read()
open(sys.argv[2], "w", encoding="utf-8").write("# From file\\n\\n" + text)
print("this stdout is ignored")
"""

NO_OUTPUT_FILE = """
import sys
print("forgot to write", sys.argv[2])
"""

ENTRIES = """
import json, sys
names = open(sys.argv[1], encoding="utf-8").read().split()
print(json.dumps([
    {"path": f"docs/{name}.md", "contents": f"# {name.title()}\\n\\nAbout {name}.",
     "metadata": {"member": name, "source": "overridden"}}
    for name in names
]))
"""

FAIL = """
import sys
print("partial output")
print("line one\\nsomething went wrong: " + " ".join(sys.argv[1:]), file=sys.stderr)
sys.exit(3)
"""

ECHO_ARGS = """
import sys
print("args:", " ".join(sys.argv[1:]))
print("seen", " ".join(sys.argv[1:]), file=sys.stderr)
sys.exit(int(sys.argv[-1].endswith("fail")))
"""


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(body, encoding="utf-8")
    return f"{PY} {shlex.quote(str(path))}"


def policy(templates: dict[str, str], **kwargs) -> CommandPolicy:
    return CommandPolicy.from_templates(templates, **kwargs)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------- templates


@pytest.mark.parametrize(
    ("name", "template", "message"),
    [
        ("x", "cat $1", "two or more"),
        ("http", "cat $1", "not one of"),
        ("FILE", "cat $1", "not one of"),
        ("a b", "cat $1", "two or more"),
        ("pdf", "cat '$1", "cannot split"),
        ("pdf", "   ", "empty command"),
        ("pdf", "tool --in=$1", "whole argument"),
        ("pdf", "tool $1 -o=$2", "whole argument"),
        ("pdf", "tool input.pdf", r"take the input as \$1"),
        ("pdf", "sh -c 'tool \"$1\"' extra", "one quoted"),
        ("pdf", "bash -c 'tool input'", r'must use "\$1"'),
    ],
)
def test_bad_templates_are_rejected(name: str, template: str, message: str):
    with pytest.raises(ValueError, match=message):
        parse_loader(name, template)


def test_template_parts():
    plain = parse_loader("pdf", "pdftotext -layout $1 $2 --key={{PDF_KEY}}")
    assert plain.argv == ("pdftotext", "-layout", "$1", "$2", "--key={{PDF_KEY}}")
    assert (plain.shell, plain.uses_output, plain.secrets) == (False, True, ("PDF_KEY",))
    assert plain.suffix == ".pdf"
    shell = parse_loader("Doc-x", '/bin/bash -c \'convert "${1}" > "$2"\'')
    assert shell.shell and shell.uses_output and shell.suffix == ".doc-x"
    assert not parse_loader("md", "sh -c 'cat \"$1\"'").uses_output


def test_config_validates_loaders(tmp_path: Path):
    config = config_from_dict({"document_loaders": {"pdf": "pdftotext $1 -"}})
    assert config.document_loaders == {"pdf": "pdftotext $1 -"}
    assert config.loader_timeout == 120
    with pytest.raises(ConfigError, match=r"document_loaders.*whole argument"):
        config_from_dict({"document_loaders": {"pdf": "pdftotext --in=$1"}})
    with pytest.raises(ConfigError, match="loader_timeout"):
        config_from_dict({"loader_timeout": 0})
    with pytest.raises(SourceError, match="Invalid document loader"):
        policy({"pdf": "pdftotext"})
    built = CommandPolicy.from_config(
        config_from_dict({"document_loaders": {"pdf": "a $1"}, "loader_timeout": 5}),
        allow_commands=True,
    )
    assert built.timeout == 5 and built.allow_commands and built.suffixes == (".pdf",)


# ------------------------------------------------------------------------ specs


def test_spec_grammar():
    assert parse_spec("pdf:docs/a.pdf", {"pdf"}) == LoaderSpec(
        "pdf:docs/a.pdf", "pdf", "docs/a.pdf"
    )
    assert isinstance(parse_spec("pdf:docs/a.pdf"), PathSpec)  # not a configured loader
    assert isinstance(parse_spec("https://example.com/a", {"pdf"}), UrlSpec)
    assert parse_spec(" `git diff --stat` ") == CommandSpec("`git diff --stat`", "git diff --stat")
    with pytest.raises(SourceError, match="no input after the colon"):
        parse_spec("pdf: ", {"pdf"})
    with pytest.raises(SourceError, match="Empty command"):
        parse_spec("`  `")
    assert split_specs("a.md;`make; cat log`;b.md") == ["a.md", "`make; cat log`", "b.md"]
    assert split_specs(["`a;b`", "c;d"]) == ["`a;b`", "c", "d"]


def test_scopes_judge_loader_entries_by_their_file():
    directory = Scope("prefix", "file:///d/", suffixes=(".md", ".zip"))
    assert directory.covers("file:///d/x.zip#inner/a.txt")
    assert not directory.covers("file:///d/x.bin#inner/a.md")
    glob = Scope("glob", "file:///d/**/*.zip")
    assert glob.covers("file:///d/sub/x.zip#a.md")
    assert not glob.covers("file:///d/sub/x.md#a.zip")


# ----------------------------------------------------------------------- loaders


async def test_loader_with_input_on_stdout(tmp_path: Path):
    source = write(tmp_path / "notes.txt", "# Notes\n\nquiet text\n")
    commands = policy({"up": f"{script(tmp_path, 'upper', UPPER)} $1"})
    batch = await load_sources([f"up:{source}"], commands=commands)
    [document] = batch.documents
    assert document.content == "# NOTES\n\nQUIET TEXT\n"
    assert document.uri == source.resolve().as_uri() and document.title == "NOTES"
    assert document.metadata["loader"] == "up" and document.metadata["source"] == "loader"
    assert document.metadata["path"] == str(source.resolve()) and "mtime" in document.metadata
    assert Scope("prefix", document.uri + "#") in batch.scopes


async def test_loader_with_output_file(tmp_path: Path):
    source = write(tmp_path / "in.txt", "body text")
    commands = policy({"conv": f"{script(tmp_path, 'to_file', TO_FILE)} $1 $2"})
    [document] = (await load_sources([f"conv:{source}"], commands=commands)).documents
    assert document.content == "# From file\n\nbody text" and document.title == "From file"

    broken = policy({"conv": f"{script(tmp_path, 'none', NO_OUTPUT_FILE)} $1 $2"})
    with pytest.raises(SourceError, match=r"Loader 'conv' did not write its output file \$2"):
        await load_sources([f"conv:{source}"], commands=broken)


async def test_loader_in_a_shell_gets_values_as_arguments(tmp_path: Path):
    source = write(tmp_path / "it's $(weird) & more.txt", "shell-safe\n")
    commands = policy({"cat2": 'sh -c \'cat "$1" > "$2"; echo "$0" >> "$2"\''})
    [document] = (await load_sources([f"cat2:{source}"], commands=commands)).documents
    assert document.content == "shell-safe\nhaiku-rag-cat2\n"


async def test_loader_input_that_is_not_a_path(tmp_path: Path):
    commands = policy({"ticket": "sh -c 'echo \"# Ticket $1\"; echo details'"})
    batch = await load_sources(["ticket:ABC-123"], commands=commands)
    [document] = batch.documents
    assert document.uri == "ticket:ABC-123" and document.title == "Ticket ABC-123"
    assert document.metadata["input"] == "ABC-123" and "path" not in document.metadata
    assert Scope("exact", "ticket:ABC-123") in batch.scopes


async def test_json_output_is_one_document_per_entry(tmp_path: Path):
    archive = write(tmp_path / "bundle.arc", "alpha beta")
    commands = policy({"arc": f"{script(tmp_path, 'entries', ENTRIES)} $1"})
    batch = await load_sources([f"arc:{archive}"], commands=commands)
    base = archive.resolve().as_uri()
    assert [d.uri for d in batch.documents] == [f"{base}#docs/alpha.md", f"{base}#docs/beta.md"]
    alpha = batch.documents[0]
    assert alpha.title == "Alpha" and alpha.content == "# Alpha\n\nAbout alpha."
    assert alpha.metadata["member"] == "alpha" and alpha.metadata["entry"] == "docs/alpha.md"
    assert alpha.metadata["source"] == "loader" and alpha.metadata["loader"] == "arc"

    # the same loader claims `.arc` files by extension, a directory included
    batch = await load_sources([str(tmp_path)], commands=commands)
    assert f"{base}#docs/beta.md" in {d.uri for d in batch.documents}


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ('[{"path": "a", "contents": 3}]', "entry 0: 'contents' must be a string"),
        ('[{"path": "", "contents": "x"}]', "'path' must be a non-empty string"),
        ('[{"path": "a", "contents": "x", "metadata": [1]}]', "'metadata' must be an object"),
        ('[{"path": "a", "contents": "x"}, {"path": "a", "contents": "y"}]', "twice"),
    ],
)
async def test_malformed_json_entries_are_errors(tmp_path: Path, output: str, message: str):
    write(tmp_path / "out.json", output)
    commands = policy({"js": "cat $1"})
    with pytest.raises(SourceError, match=message):
        await load_sources([f"js:{tmp_path / 'out.json'}"], commands=commands)


@pytest.mark.parametrize("output", ["[1, 2, 3]", "[not json", "[]x", '[{"name": "a"}]'])
async def test_other_output_that_looks_like_json_is_text(tmp_path: Path, output: str):
    write(tmp_path / "out.txt", output)
    [document] = (
        await load_sources([f"js:{tmp_path / 'out.txt'}"], commands=policy({"js": "cat $1"}))
    ).documents
    assert document.content == output


async def test_an_empty_json_list_is_no_documents(tmp_path: Path):
    write(tmp_path / "out.json", "[]")
    batch = await load_sources([f"js:{tmp_path / 'out.json'}"], commands=policy({"js": "cat $1"}))
    assert batch.documents == []


async def test_failing_loader_names_the_loader_and_the_command(tmp_path: Path):
    source = write(tmp_path / "a.txt", "x")
    commands = policy({"bad": f"{script(tmp_path, 'fail', FAIL)} $1"})
    with pytest.raises(SourceError) as caught:
        await load_sources([f"bad:{source}"], commands=commands)
    message = str(caught.value)
    assert "Loader 'bad' failed with exit code 3" in message
    assert "fail.py" in message and str(source.resolve()) in message
    assert "something went wrong" in message


async def test_missing_program_is_a_clear_error(tmp_path: Path):
    source = write(tmp_path / "a.txt", "x")
    commands = policy({"gone": "no-such-program-6a $1"})
    with pytest.raises(SourceError, match="Loader 'gone': program 'no-such-program-6a' not found"):
        await load_sources([f"gone:{source}"], commands=commands)
    denied = write(tmp_path / "not-executable", "#!/bin/sh\n")
    with pytest.raises(SourceError, match="Loader 'nox': cannot run"):
        run_loader(parse_loader("nox", f"{denied} $1"), "x", uri="nox:x")


async def test_loader_output_must_be_text(tmp_path: Path):
    write(tmp_path / "blob.bin", "a\x00b")
    with pytest.raises(SourceError, match="Loader 'bin' produced output that is not text"):
        await load_sources([f"bin:{tmp_path / 'blob.bin'}"], commands=policy({"bin": "cat $1"}))


async def test_loader_timeout_kills_the_command(tmp_path: Path):
    commands = policy(
        {"slow": "sh -c 'sleep 30 & sleep 30; echo \"$1\"'"}, timeout=0.5, allow_commands=True
    )
    started = time.monotonic()
    with pytest.raises(SourceError, match=r"Loader 'slow' timed out after 0.5 s .*loader_timeout"):
        await load_sources(["slow:x"], commands=commands)
    with pytest.raises(SourceError, match=r"Command `sleep 30` timed out"):
        await load_sources(["`sleep 30`"], commands=commands)
    assert time.monotonic() - started < 10


async def test_secrets_come_from_the_environment_and_are_never_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    echo = script(tmp_path, "echo_args", ECHO_ARGS)
    source = write(tmp_path / "a.txt", "x")
    commands = policy(
        {
            "tok": f"{echo} $1 --token={{{{API_TOKEN}}}}",
            "tokfail": f"{echo} $1 --token={{{{API_TOKEN}}}} fail",
            "shtok": "sh -c 'echo \"$1\" {{API_TOKEN}}'",
        }
    )
    monkeypatch.delenv("API_TOKEN", raising=False)
    with pytest.raises(SourceError, match=r"needs the environment variable API_TOKEN"):
        await load_sources([f"tok:{source}"], commands=commands)

    secret = "s3cr3t-value-42"
    monkeypatch.setenv("API_TOKEN", secret)
    [document] = (await load_sources([f"tok:{source}"], commands=commands)).documents
    assert "--token={{API_TOKEN}}" in document.content  # the program saw it; we keep no copy
    assert secret not in document.model_dump_json()

    with pytest.raises(SourceError) as caught:
        await load_sources([f"tokfail:{source}"], commands=commands)
    assert secret not in str(caught.value)
    assert "--token={{API_TOKEN}}" in str(caught.value)  # the command as configured

    [shell] = (await load_sources(["shtok:ABC"], commands=commands)).documents
    assert shell.content == "ABC {{API_TOKEN}}\n" and secret not in shell.model_dump_json()


async def test_loader_metadata_is_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LEAKY", "leaky-secret-123")
    meta = {"k": ["leaky-secret-123"], "n": 3}
    out = json.dumps([{"path": "a", "contents": "ok", "metadata": meta}])
    write(tmp_path / "out.json", out)
    commands = policy({"js": "cat $1 {{LEAKY}}"})  # cat reads the file, then fails on the secret
    with pytest.raises(SourceError) as caught:
        await load_sources([f"js:{tmp_path / 'out.json'}"], commands=commands)
    assert "leaky-secret-123" not in str(caught.value) and "{{LEAKY}}" in str(caught.value)
    [document] = (
        await load_sources([f"js:{tmp_path / 'out.json'}"], commands=policy({"js": "cat $1"}))
    ).documents
    assert document.metadata["k"] == ["leaky-secret-123"]  # not a secret of this loader
    redacting = policy({"js": "sh -c 'cat \"$1\" # {{LEAKY}}'"})
    [document] = (await load_sources([f"js:{tmp_path / 'out.json'}"], commands=redacting)).documents
    assert document.metadata["k"] == ["{{LEAKY}}"] and document.metadata["n"] == 3


async def test_extension_loaders_inside_directories_and_globs(tmp_path: Path):
    root = tmp_path / "docs"
    write(root / "readme.md", "# Readme\n\nplain markdown")
    write(root / "sub" / "report.UPX", "shout this")
    write(root / "sub" / "broken.upx", "")
    write(root / "data.bin", "skipped")
    commands = policy({"upx": f"{script(tmp_path, 'upper', UPPER_OR_FAIL)} $1"})
    batch = await load_sources([str(root)], commands=commands)
    contents = {Path(d.uri).name: d.content for d in batch.documents}
    assert contents == {"readme.md": "# Readme\n\nplain markdown", "report.UPX": "SHOUT THIS"}
    [failure] = batch.failures
    assert failure.uri.endswith("broken.upx") and "exit code 9" in failure.reason
    assert ".upx" in batch.scopes[0].suffixes

    glob = await load_sources([f"{root}/**/*.UPX"], commands=commands)
    assert [Path(d.uri).name for d in glob.documents] == ["report.UPX"]
    without = await load_sources([str(root)])
    assert {Path(d.uri).name for d in without.documents} == {"readme.md"}
    with pytest.raises(SourceError, match="exit code 9"):
        await load_sources([str(root / "sub" / "broken.upx")], commands=commands)


async def test_plan_loader_resolves_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "rel.txt", "x")
    commands = policy({"up": "cat $1"})
    plan = plan_loader(LoaderSpec("up:rel.txt", "up", "rel.txt"), commands)
    assert plan.file == tmp_path / "rel.txt" and plan.argument == str(tmp_path / "rel.txt")
    with pytest.raises(SourceError, match="No document loader named 'zz'"):
        plan_loader(LoaderSpec("zz:x", "zz", "x"), commands)


# ---------------------------------------------------------------------- commands


async def test_backtick_command_output_is_one_document(tmp_path: Path):
    allowed = CommandPolicy(allow_commands=True)
    batch = await load_sources(["`printf '# Diff\\n\\na; b\\n'; echo done`"], commands=allowed)
    [document] = batch.documents
    assert document.uri == "cmd:printf '# Diff\\n\\na; b\\n'; echo done"
    assert document.content == "# Diff\n\na; b\ndone\n" and document.title == "Diff"
    assert document.metadata == {"source": "command", "command": document.uri[4:]}
    assert batch.scopes == [Scope("exact", document.uri)]
    assert run_command("echo plain", timeout=5).title == "echo plain"


async def test_backtick_commands_only_run_when_allowed(tmp_path: Path):
    marker = tmp_path / "ran"
    with pytest.raises(SourceError, match="only run where a person typed it"):
        await load_sources([f"`touch {marker}`"])
    assert not marker.exists()
    with pytest.raises(SourceError, match="Empty command"):
        run_command("  ")


async def test_failing_command_reports_exit_code_and_stderr():
    allowed = CommandPolicy(allow_commands=True)
    with pytest.raises(SourceError) as caught:
        await load_sources(["`echo out; echo 'it broke' >&2; exit 4`"], commands=allowed)
    message = str(caught.value)
    assert "failed with exit code 4" in message and "it broke" in message
    with pytest.raises(SourceError, match="exit code 127"):
        await load_sources(["`no-such-command-6a`"], commands=allowed)
    with pytest.raises(SourceError, match="not text"):
        await load_sources(["`printf 'a\\000b'`"], commands=allowed)


# ------------------------------------------------------- through the client / CLI


@pytest.fixture
def loader_config(tmp_path: Path) -> AppConfig:
    return config_from_dict(
        {
            "embeddings": {"model": "hash:v1", "dimension": 64},
            "document_loaders": {"arc": f"{script(tmp_path, 'entries', ENTRIES)} $1"},
        }
    )


async def test_entries_that_vanish_are_pruned_and_a_failure_keeps_them(
    tmp_path: Path, loader_config: AppConfig
):
    archive = write(tmp_path / "src" / "bundle.arc", "alpha beta")
    async with HaikuRAG(tmp_path / "kb.lancedb", loader_config, create=True) as kb:
        report = await kb.add(str(archive))
        assert len(report.added) == 2
        archive.write_text("alpha", encoding="utf-8")
        report = await kb.add(str(archive))
        assert report.deleted == [f"{archive.resolve().as_uri()}#docs/beta.md"]
        archive.write_text("alpha gamma", encoding="utf-8")
        report = await kb.add(str(tmp_path / "src"))
        assert report.added == [f"{archive.resolve().as_uri()}#docs/gamma.md"]

        loader_config.document_loaders["arc"] = "sh -c 'exit 2; echo \"$1\"'"
        report = await kb.add(str(tmp_path / "src"))  # the archive fails: keep its entries
        assert report.deleted == [] and len(report.failed) == 1
        assert len(await kb.list_documents()) == 2

        with pytest.raises(SourceError, match="allow_commands=True"):
            await kb.add("`echo hi`")
        report = await kb.add("`echo from a command`", allow_commands=True)
        assert report.added == ["cmd:echo from a command"]


def test_cli_add_runs_loaders_and_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    config = tmp_path / "haiku.rag.yaml"
    upper = script(tmp_path, "upper", UPPER)
    config.write_text(
        yaml.safe_dump(
            {
                "embeddings": {"model": "hash:v1", "dimension": 64},
                "document_loaders": {"up": f"{upper} $1"},
            }
        )
    )
    monkeypatch.setenv("HAIKU_RAG_CONFIG", str(config))
    monkeypatch.setenv("HAIKU_RAG_DB", str(tmp_path / "kb.lancedb"))
    source = write(tmp_path / "a.txt", "quiet words")
    runner = CliRunner()
    result = runner.invoke(app, ["add", f"up:{source}", "`echo loud words`"])
    assert result.exit_code == 0, result.output
    assert "2 added" in result.stdout
    listed = json.loads(runner.invoke(app, ["list", "--json"]).stdout)
    assert {row["uri"] for row in listed} == {source.resolve().as_uri(), "cmd:echo loud words"}
    got = runner.invoke(app, ["get", str(source)])
    assert "QUIET WORDS" in got.stdout
