"""docs/layout.md's map of the layers names every module of the tree, and docs/adding-a-verdict-family.md every
built-in verdict family, so that they cannot fall behind the code again.

The map is the first fenced block of docs/layout.md: an entry starts on a line whose first NAME_WIDTH characters hold
dotted package (or module) names separated by `|` (a bare name is a sibling of the first: `harness.models | rundir`),
and goes on over the lines whose name column is blank. Every package of harness/ and adapters/ has an entry, every
module of a package is named (as a word) in its package's entry, every module at the top of harness/ has an entry of
its own, and every name an entry gives exists."""

from __future__ import annotations

import re
from pathlib import Path

from harness.verdicts.family import BUILTIN, families

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ROOT / "docs" / "layout.md"
NAME_WIDTH = 33  # the map's name column


def entries() -> dict[str, str]:
    """Each package or module the map names -> the text of its entry (names and description)."""
    block = LAYOUT.read_text().split("```")[1]
    found: dict[str, str] = {}
    names: list[str] = []
    for line in block.splitlines()[1:]:
        if line[:NAME_WIDTH].strip():
            first, *others = [name.strip() for name in line[:NAME_WIDTH].split("|")]
            parent = first.rsplit(".", 1)[0] if "." in first else ""
            names = [first, *[name if "." in name else f"{parent}.{name}" for name in others]]
            for name in names:
                found[name] = ""
        for name in names:
            found[name] += " " + line.strip()
    return found


def packages() -> list[Path]:
    return sorted(init.parent for root in ("harness", "adapters") for init in (ROOT / root).rglob("__init__.py")
                  if "__pycache__" not in init.parts)


def dotted(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def modules(package: Path) -> list[str]:
    return sorted(path.stem for path in package.glob("*.py") if path.stem != "__init__")


def named(word: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


def test_the_map_is_found() -> None:
    found = entries()
    assert "harness.core" in found and "adapters" in found and named("vocabulary", found["harness.core"])


def test_every_module_of_every_package_is_named_in_its_entry() -> None:
    found = entries()
    missing = {}
    for package in packages():
        if package == ROOT / "harness":  # its modules are entries of their own
            continue
        name = dotted(package)
        if name not in found:
            missing[name] = ["(the package has no entry)"]
            continue
        unnamed = [module for module in modules(package) if not named(module, found[name])]
        if unnamed:
            missing[name] = unnamed
    assert not missing, f"docs/layout.md does not name these modules in their package's entry: {missing}"


def test_every_top_level_module_has_an_entry_and_every_entry_exists() -> None:
    found = entries()
    top = [f"harness.{module}" for module in modules(ROOT / "harness")]
    assert not [m for m in top if m not in found], f"docs/layout.md has no entry for {top}"
    known = {dotted(package) for package in packages()} | set(top)
    assert not [name for name in found if name not in known], f"docs/layout.md names what is not in the tree: {found}"


def test_every_built_in_verdict_family_is_listed() -> None:
    text = (ROOT / "docs" / "adding-a-verdict-family.md").read_text().split("\n\n")[1]  # its first paragraph
    built_in = [family.name for family in families() if f"{type(family).__module__}:FAMILY" in BUILTIN]
    assert len(built_in) == len(BUILTIN)
    assert not [name for name in built_in if f"`{name}`" not in text], text
