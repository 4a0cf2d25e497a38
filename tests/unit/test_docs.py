"""The documentation stays true to the repository and to the CLI; no engine, no file is run or written.

(a) Links. Every relative Markdown link in README.md and docs/*.md (outside code: fenced blocks and inline code are
not links) resolves to an existing file or folder, relative to the file that holds it; a `file.md#anchor` link (or a
same-file `#anchor`) names a heading of that file, by GitHub's slug rules: the heading's rendered text (link and
image text kept, backticks and inline HTML dropped), lower-cased, every character that is not a letter, digit, `_`,
`-` or space removed, spaces turned into `-`, and `-1`, `-2`, ... appended to repeats. Web links are not fetched.

(b) Commands. Every `parity ...` command the docs quote is parsed in full by the real CLI, `harness.cli:app`: the
typer app's click command (`typer.main.get_command`), its subcommand chain resolved as `TyperGroup.invoke` resolves
it, and `make_context(..., resilient_parsing=False)` on each level, so an unknown option or command, a missing
argument or a value of the wrong type fails, while no command body is ever called. What counts as a quoted command:

- in a fenced block (not yaml, python, toml or json): where any line has a `$ ` prompt, the prompted `$ parity ...`
  lines and nothing else (the rest is output); in a block without prompts that starts with a `parity ...` line, every
  line that starts with `parity ` (a block of commands, or the command `make` echoes before its output); any other
  block is output. A line ending in `\\`, or followed by indented lines starting with `[` or `-` (a usage synopsis
  wrapped over lines), continues on the next line; `# ...` comments and anything after `|`, `||`, `&&`, `;` or `>`
  are dropped;
- inline code in prose that starts with `parity `. An inline span that is only a command's name
  (`parity explain`), or a name and options without values (`parity run --plan`), mentions the command rather than
  quotes a command line: the chain must resolve and each option must exist on that command, nothing more.

Usage synopses are read as the commands they describe, with every optional part given: `[--engines a,b]` becomes
`--engines a,b`, `SCENARIO...` one `SCENARIO`, and a choice written `local|ray` is checked as each of its
alternatives.

Placeholders (RUN_DIR, reports/<run-id>, SCENARIO, baselines/NAME, a scenario file that only exists in the text)
must not fail a correct command. They parse as they are: `harness.cli` declares no parameter with `exists=True` (the
command bodies check paths, to give their one-line errors and exit 2), and every positional argument is a string
or a path, so any word is a valid value; `test_placeholders_parse_as_written` asserts exactly that, so a future
`exists=True` or typed argument fails there with this explanation instead of failing every doc line that names a
placeholder (the fix would be to substitute an existing path for that parameter's placeholders here). The one
substitution: an all-caps placeholder (`N`, `ID`) or a `<...>` one given to an option typed int, float or choice is
replaced by a sample of that type (`1`, `1.0`, the first choice) before parsing.
"""

from __future__ import annotations

import re
import shlex
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer._click import exceptions as click_errors  # typer (pinned) vendors click here
from typer.core import TyperArgument, TyperGroup, TyperOption

from harness.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CLI = typer.main.get_command(app)

FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
NOT_SHELL = {"yaml", "yml", "python", "py", "toml", "json"}
SHELL_STOPS = {"|", "||", "&&", ";"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$|<[^>]+>")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --- Markdown -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language and its lines, each with its line number."""

    lang: str
    lines: list[tuple[int, str]]


def split_markdown(text: str) -> tuple[list[list[tuple[int, str]]], list[Block]]:
    """Prose paragraphs (runs of non-blank lines outside fences, with line numbers) and fenced code blocks."""
    paragraphs: list[list[tuple[int, str]]] = [[]]
    blocks: list[Block] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
            blocks.append(Block(opened.group(2).lower(), []))
            paragraphs.append([])
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            else:
                blocks[-1].lines.append((number, line))
        elif line.strip():
            paragraphs[-1].append((number, line))
        else:
            paragraphs.append([])
    return [p for p in paragraphs if p], blocks


def github_slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or image: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    paragraphs, _ = split_markdown(path.read_text())
    seen: dict[str, int] = {}
    for paragraph in paragraphs:
        for _, line in paragraph:
            if match := HEADING.match(line):
                slug = github_slug(match.group(2))
                seen[slug] = seen.get(slug, -1) + 1
                if seen[slug]:
                    seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def inline_spans(paragraph: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Inline code spans of a paragraph (they may wrap over lines), each with the line it starts on."""
    text = "\n".join(line for _, line in paragraph)
    for match in INLINE_CODE.finditer(text):
        yield paragraph[text.count("\n", 0, match.start())][0], " ".join(match.group(2).split())


@dataclass(frozen=True)
class Link:
    where: str
    source: Path
    target: str


def links(path: Path) -> Iterator[Link]:
    paragraphs, _ = split_markdown(path.read_text())
    for paragraph in paragraphs:
        text = "\n".join(line for _, line in paragraph)
        text = INLINE_CODE.sub(lambda m: "code" + "\n" * m.group(0).count("\n"), text)  # code is not a link
        for match in LINK.finditer(text):
            number = paragraph[text.count("\n", 0, match.start())][0]
            yield Link(f"{rel(path)}:{number}", path, match.group(1))


# --- Quoted commands ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quoted:
    where: str
    text: str
    inline: bool


def block_commands(block: Block) -> Iterator[tuple[int, str]]:
    if block.lang in NOT_SHELL:
        return
    lines = block.lines
    prompted = any(line.lstrip().startswith("$ ") for _, line in lines)
    first = next((line.strip() for _, line in lines if line.strip()), "")
    if not prompted and not first.startswith("parity "):
        return  # an output block
    i = 0
    while i < len(lines):
        number, line = lines[i]
        i += 1
        text = line.strip()
        if prompted:
            if not text.startswith("$ parity "):
                continue
            text = text[2:]
        elif not text.startswith("parity "):
            continue
        while i < len(lines) and (text.endswith("\\") or (
                not prompted and lines[i][1][:1].isspace() and lines[i][1].strip()[:1] in ("[", "-"))):
            text = text.removesuffix("\\") + "\n" + lines[i][1]
            i += 1
        yield number, text


def quoted_commands(path: Path) -> Iterator[Quoted]:
    paragraphs, blocks = split_markdown(path.read_text())
    for block in blocks:
        for number, text in block_commands(block):
            yield Quoted(f"{rel(path)}:{number}", text, inline=False)
    for paragraph in paragraphs:
        for number, text in inline_spans(paragraph):
            if text.startswith("parity "):
                yield Quoted(f"{rel(path)}:{number}", text, inline=True)


def ungrammar(word: str) -> str:
    """`[--engines` -> `--engines`, `ID]...` -> `ID`, `SCENARIO...` -> `SCENARIO`; `chat[top_k=5]` stays."""
    while True:
        new = word.removesuffix("...").removeprefix("[")
        if new.count("]") > new.count("[") and new.endswith("]"):
            new = new[:-1]
        if new == word:
            return word
        word = new


def words(text: str) -> list[str]:
    """The arguments after `parity`, as a shell would split them, usage grammar read as the full command."""
    text = re.sub(r"(^|\s)#.*$", "", text, flags=re.MULTILINE)
    split = shlex.split(text)
    assert split[0] == "parity", text
    args: list[str] = []
    for word in split[1:]:
        if word in SHELL_STOPS or word.startswith(">") or word.startswith("2>"):
            break
        if word := ungrammar(word):
            args.append(word)
    return args


def resolve(args: list[str]) -> tuple[typer.core.click.Command, list[str]]:
    """The command the leading words name (a group if they stop at one) and the words after them."""
    command, rest = CLI, list(args)
    while isinstance(command, TyperGroup) and rest and rest[0] in command.commands:
        command = command.commands[rest.pop(0)]
    return command, rest


def option_names(command) -> dict[str, TyperOption]:
    return {name: p for p in command.params if isinstance(p, TyperOption) for name in (*p.opts, *p.secondary_opts)}


def sample(option: TyperOption, value: str) -> str:
    """A placeholder given to an int, float or choice option, replaced by a value of that type."""
    descriptor = option.type_descriptor
    if not PLACEHOLDER.search(value):
        return value
    if descriptor.choices:
        return str(getattr(descriptor.choices[0], "value", descriptor.choices[0]))
    return {int: "1", float: "1.0"}.get(descriptor.annotation, value)


def variants(args: list[str]) -> list[list[str]]:
    """The command lines to parse: placeholders of typed options replaced, `a|b` choices expanded."""
    command, rest = resolve(args)
    head = args[:len(args) - len(rest)]
    options = option_names(command) if not isinstance(command, TyperGroup) else {}
    out: list[list[str]] = [head]
    i = 0
    while i < len(rest):
        word = rest[i]
        i += 1
        name, eq, value = word.partition("=")
        option = options.get(name)
        if option is None or option.is_flag or (not eq and i >= len(rest)):
            out = [v + [word] for v in out]
            continue
        if not eq:
            value = rest[i]
            i += 1
        values = value.split("|") if option.type_descriptor.choices and "|" in value else [value]
        out = [v + [name, sample(option, one)] for v in out for one in values]
    return out


def parse(args: list[str]) -> None:
    """Parse a full command line as `parity` would, invoking nothing; raises the CLI's usage errors."""
    ctx = CLI.make_context("parity", list(args), resilient_parsing=False)
    command = CLI
    while isinstance(command, TyperGroup):
        rest = [*ctx._protected_args, *ctx.args]  # where TyperGroup.invoke reads the subcommand's words back
        if not rest:
            raise click_errors.UsageError("Missing command.", ctx)
        name, command, sub = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, sub, parent=ctx, resilient_parsing=False)


def check(quoted: Quoted) -> None:
    args = words(quoted.text)
    command, rest = resolve(args)
    if "--help" in rest or (quoted.inline and all(w.startswith("-") for w in rest)):
        known = option_names(command) if not isinstance(command, TyperGroup) else {}
        unknown = [w for w in rest if w != "--help" and w.partition("=")[0] not in known]
        assert not unknown, f"no such option(s) {unknown} on `parity {' '.join(args[:len(args) - len(rest)])}`"
        if not rest and isinstance(command, TyperGroup) and command is CLI:
            raise AssertionError("names no command")
        return
    for line in variants(args):
        parse(line)


COMMANDS = [q for path in DOCS for q in quoted_commands(path)]
LINKS = [link for path in DOCS for link in links(path)]


# --- Tests ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("link", LINKS, ids=[f"{link.where} {link.target}" for link in LINKS])
def test_relative_link_resolves(link: Link) -> None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", link.target):
        return  # a web link (http:, https:, mailto:): not fetched
    target, _, anchor = link.target.partition("#")
    path = (link.source.parent / urllib.parse.unquote(target)).resolve() if target else link.source
    assert path.exists(), f"{link.where}: {link.target}: no such file ({path})"
    if anchor and path.suffix == ".md":
        assert anchor in anchors(path), f"{link.where}: {link.target}: {rel(path)} has no heading #{anchor}"


@pytest.mark.parametrize("quoted", COMMANDS, ids=[f"{q.where} {q.text.splitlines()[0]}" for q in COMMANDS])
def test_quoted_command_parses(quoted: Quoted) -> None:
    try:
        check(quoted)
    except click_errors.ClickException as exc:
        raise AssertionError(f"{quoted.where}: `{quoted.text}` does not parse: {exc.format_message()}") from None


def test_the_docs_are_found() -> None:
    names = {rel(p) for p in DOCS}
    assert {"README.md", "docs/cli.md", "docs/engines-and-servers.md"} <= names
    assert len(COMMANDS) > 50 and len(LINKS) > 30, (len(COMMANDS), len(LINKS))


def test_every_cli_command_is_quoted() -> None:
    """The check is only as good as its coverage: each leaf command appears in some doc."""

    def leaves(command, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        if isinstance(command, TyperGroup):
            for name, sub in command.commands.items():
                yield from leaves(sub, (*path, name))
        else:
            yield path

    quoted = {tuple(words(q.text)[:len(p)]) for q in COMMANDS for p in leaves(CLI, ())}
    missing = [" ".join(p) for p in leaves(CLI, ()) if p not in quoted]
    assert not missing, f"no doc quotes `parity {missing}`"


@pytest.mark.parametrize("line", [
    "parity run scenarios/quickstart.yaml --no-such-flag",
    "parity run scenarios/quickstart.yaml --parallel many",
    "parity run scenarios/quickstart.yaml --executor slurm",
    "parity explain --case list",
    "parity gate scenarios/quickstart.yaml",
    "parity baseline save reports/x",
    "parity modles list",
    "parity models",  # a group without its subcommand: as a command line it only prints help and exits 2
])
def test_a_wrong_command_line_fails(line: str) -> None:
    with pytest.raises((click_errors.ClickException, AssertionError)):
        check(Quoted("test", line, inline=False))
    if line != "parity models":  # inline, it mentions the group, which is fine
        with pytest.raises((click_errors.ClickException, AssertionError)):
            check(Quoted("test", line, inline=True))


@pytest.mark.parametrize("line", [
    "parity run --resume RUN_DIR [--parallel N]",
    "parity explain SCENARIO [--case ID]... [--engines a,b] [--allow-missing] [--k 10]",
    "parity run SCENARIO... [--executor local|ray] [--ray-address auto|HOST:PORT|ray://HOST:PORT]  # comment",
    "parity baseline save reports/<run-id> --to baselines/NAME",
    "parity explain scenarios/beam-search.yaml --case capital[length_penalty=1.0]",
])
def test_placeholders_and_synopses_parse(line: str) -> None:
    check(Quoted("test", line, inline=False))


def test_placeholders_parse_as_written() -> None:
    """The premise of reading RUN_DIR or reports/<run-id> as they are: nothing checks a path while parsing, and no
    positional argument wants a typed value. If this fails, teach `sample` to substitute for that parameter."""

    def params(command) -> Iterator[tuple[str, object]]:
        if isinstance(command, TyperGroup):
            for sub in command.commands.values():
                yield from params(sub)
        else:
            for param in command.params:
                yield command.name, param

    for name, param in params(CLI):
        info = param.type_descriptor.parameter_info
        assert not info.exists, f"{name} {param.name}: exists=True would fail placeholders such as RUN_DIR"
        if isinstance(param, TyperArgument):
            assert param.type_descriptor.annotation in (str, Path, list[str], list[Path]), (name, param.name)


@pytest.mark.parametrize(("heading", "slug"), [
    ("Explaining a divergence: `parity explain`", "explaining-a-divergence-parity-explain"),
    ("Invariance: an engine against itself", "invariance-an-engine-against-itself"),
    ("`scenarios/gemma3.yaml`: every engine", "scenariosgemma3yaml-every-engine"),
    ("1. Options", "1-options"),
    ("CI gate, baselines, HTML report, pytest plugin", "ci-gate-baselines-html-report-pytest-plugin"),
])
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug
