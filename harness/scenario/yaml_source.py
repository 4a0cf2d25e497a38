"""Load YAML while remembering where each key sits, so validation errors can name file:line and key path."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from harness.core.errors import ConfigError

# libyaml's parser where PyYAML was built with it (its wheels are): the same safe constructor, about 10x faster than
# the pure-Python scanner, which took most of the time of validating a scenario (the fuzz tests' 500 files: 150 s of
# 190 s under a profiler)
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlSource:
    def __init__(self, path: Path, text: str | None = None):
        """text: the file's content when it is already known (a resumed run's recorded scenario)."""
        self.path = path
        if text is None:
            text = _read(path)
        try:
            self.root, self.data = _parse(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else str(path)
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"{where}: invalid YAML: {problem}: fix the syntax on that line") from None
        self._no_duplicate_keys()

    def _no_duplicate_keys(self) -> None:
        """YAML keeps the last of two equal keys and drops the other silently (an engine, a param): refuse it."""
        seen: set[int] = set()
        stack = [self.root] if self.root is not None else []
        while stack:
            node = stack.pop()
            if id(node) in seen:  # an alias: already checked (and anchors may nest themselves)
                continue
            seen.add(id(node))
            if isinstance(node, yaml.MappingNode):
                first: dict[str, int] = {}
                for key, value in node.value:
                    if isinstance(key, yaml.ScalarNode) and key.value in first and key.tag != "tag:yaml.org,2002:merge":
                        raise ConfigError(f"{self.path}:{key.start_mark.line + 1}: key '{key.value}' is given twice "
                                          f"in one mapping (first on line {first[key.value]}): YAML would silently "
                                          "keep only the last; remove or rename one")
                    first[key.value] = key.start_mark.line + 1
                    stack += [key, value]
            elif isinstance(node, yaml.SequenceNode):
                stack += node.value

    def line_of(self, loc: Sequence[Any]) -> int | None:
        """1-based line of the deepest node on the key path `loc` that exists in the file."""
        return self._walk(loc)[0]

    def written(self, loc: Sequence[Any]) -> str | None:
        """The text a scalar at the key path `loc` has in the file (`yes` where YAML read True), if it is one."""
        line, node, whole = self._walk(loc)
        return node.value if whole and isinstance(node, yaml.ScalarNode) else None

    def _walk(self, loc: Sequence[Any]) -> tuple[int | None, yaml.Node | None, bool]:
        """The line and node of the deepest node on the key path, and whether the whole path was found."""
        node = self.root
        line = node.start_mark.line + 1 if node is not None else None
        for key in loc:
            if isinstance(node, yaml.MappingNode):
                match = next((v for k, v in node.value if k.value == str(key)), None)
                key_node = next((k for k, v in node.value if k.value == str(key)), None)
                if match is None:
                    return line, node, False
                line, node = key_node.start_mark.line + 1, match
            elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
                node = node.value[key]
                line = node.start_mark.line + 1
            else:
                return line, node, False
        return line, node, True

    def error(self, loc: Sequence[Any], message: str) -> ConfigError:
        line = self.line_of(loc)
        where = f"{self.path}:{line}" if line else str(self.path)
        path = ".".join(str(p) for p in loc)
        return ConfigError(f"{where}: {path}: {message}" if path else f"{where}: {message}")


    def validation_error(self, exc: ValidationError, prefix: tuple = ()) -> ConfigError:
        """The first problem pydantic found, as file:line: key.path: what to do."""
        # For `str | PromptSpec` unions pydantic reports both branches; the PromptSpec one is the useful one.
        err = sorted(exc.errors(), key=lambda e: e["type"] == "string_type")[0]
        loc = prefix + tuple(p for p in err["loc"] if not (isinstance(p, str) and p in ("str", "PromptSpec")))
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key: remove it or check its spelling"
        elif err["type"] == "missing":
            message = "required key is missing: add it"
        elif err["type"] == "string_type" and isinstance(err.get("input"), bool | int | float):
            message = _quote_it(self.written(loc), err["input"])
        more = f" (and {len(exc.errors()) - 1} more problem(s))" if len(exc.errors()) > 1 else ""
        return self.error(loc, message + more)


def _quote_it(written: str | None, value: bool | int | float) -> str:
    """A text field given an unquoted word YAML reads as a boolean (YAML 1.1: yes, no, on, off, true, false, in any
    case) or a number: say so, and how to write the text."""
    word = written if written is not None else str(value)
    kind = "the boolean" if isinstance(value, bool) else "the number"
    rule = " (YAML 1.1 reads unquoted yes/no/on/off/true/false that way)" if isinstance(value, bool) else ""
    return f"{word} is read as {kind} {value!r}{rule}, not as text: quote it, '{word}'"


def _parse(text: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (for line numbers) and the data built from it, in one parse."""
    loader = LOADER(text)
    try:
        root = loader.get_single_node()
        return root, loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read scenario file ({exc.strerror}): check the path") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): save "
                          "the scenario as UTF-8 YAML") from None
