"""Before anything is carried to the GPU machine: does every package the run imports find what it requires there?

Reads the requirements of llm-parity itself (pyproject.toml's dependencies) and of each carried wheel (its
Requires-Dist), evaluated for the GPU image's Python (3.12, Linux, x86-64, no extras), and fails naming each one
that neither the image (a file of its package names) nor the carried wheels provide, unless it is left out on
purpose. Names only: the image's versions are mostly unknown, and carried wheels were resolved by pip beside it.
Extras a requirement asks for (fastapi[standard]) are not followed: what they add is imported on demand only.

    requirements_check.py --image scripts/gpu/image-packages.txt [--left-out "name ..."] pyproject.toml WHEEL...

Exit 0 with a one-line count, or 1 with a line per requirement nobody provides.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare Python: pip's own copy
    from pip._vendor.packaging.requirements import Requirement

GPU_PYTHON = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def image_packages(path: Path) -> set[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return {canonical(line) for line in lines if line and not line.startswith("#")}


def wheel_metadata(wheel: Path) -> tuple[str, list[str]]:
    """(name, requirement strings) of a wheel, read from its METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        entry = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(archive.read(entry).decode())
    return canonical(meta["Name"]), meta.get_all("Requires-Dist") or []


def project_requirements(pyproject: Path) -> tuple[str, list[str]]:
    project = tomllib.loads(pyproject.read_text())["project"]
    return canonical(project["name"]), list(project.get("dependencies", []))


def needed_there(requirement: str) -> str | None:
    """The canonical name a requirement asks for on the GPU image's Python, or None when its marker excludes it."""
    parsed = Requirement(requirement)
    if parsed.marker is not None and not parsed.marker.evaluate(GPU_PYTHON):
        return None
    return canonical(parsed.name)


def unmet(requirers: list[tuple[str, list[str]]], present: set[str], left_out: set[str]) -> list[str]:
    """'name (required by X, Y)' for each requirement neither present nor left out on purpose."""
    missing: dict[str, list[str]] = {}
    for requirer, requirements in requirers:
        for requirement in requirements:
            name = needed_there(requirement)
            if name and name not in present and name not in left_out:
                missing.setdefault(name, []).append(requirer)
    return [f"{name} (required by {', '.join(sorted(by))})" for name, by in sorted(missing.items())]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", type=Path, required=True, help="the GPU image's package names, one a line")
    parser.add_argument("--left-out", default="", help="names not carried on purpose (imported on demand only)")
    parser.add_argument("pyproject", type=Path)
    parser.add_argument("wheels", type=Path, nargs="+")
    args = parser.parse_args(argv)
    carried = [wheel_metadata(wheel) for wheel in args.wheels]
    requirers = [project_requirements(args.pyproject), *carried]
    present = image_packages(args.image) | {name for name, _ in carried}
    left_out = {canonical(name) for name in args.left_out.split()}
    missing = unmet(requirers, present, left_out)
    for line in missing:
        print(f"requirements: {line} is neither in the GPU image nor carried: carry it, or name it in --left-out if "
              "nothing on the run's path imports it", file=sys.stderr)
    if missing:
        return 1
    print(f"requirements: llm-parity's and the {len(carried)} carried packages' are in the image or carried "
          f"({len(left_out)} left out on purpose)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
