"""Installing with uv under the machine's pip configuration.

uv installs and resolves in seconds where pip takes minutes (the project's ~200 wheels: 13 s against 122 s; lmdeploy's
environment resolved: 2 s against 62 s), but it reads no pip.conf. The indexes, find-links folders, constraints and
certificate a machine configured for pip (in its files or PIP_* variables, as `pip config list` reports them) are
given to uv here, so both tools take the same releases from the same places; uv picks the best version across all of
them, as pip does. scripts/bootstrap.sh installs the main environment this way, `parity env create` the engine
environments (with pip where uv is not installed).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

# pip option -> uv option; options given as several values (space-separated) repeat the flag
REPEATED = {"find-links": "--find-links", "extra-index-url": "--extra-index-url", "constraint": "--constraint"}
SINGLE = {"index-url": "--index-url"}
# where an option is set: PIP_* variables override the [install] section, which overrides [global]
PRECEDENCE = {":env:": 2, "install": 1, "global": 0}


def pip_config(listing: str) -> dict[str, str]:
    """pip's effective value of each option, from `pip config list` (lines like global.find-links='/opt/wheels')."""
    ranked: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        name, _, quoted = line.partition("=")
        section, _, key = name.rpartition(".")
        rank = PRECEDENCE.get(section)
        if rank is not None and rank >= ranked.get(key, (-1, ""))[0]:
            ranked[key] = (rank, " ".join(shlex.split(quoted)))
    return {key: value for key, (_, value) in ranked.items()}


def uv_options(config: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's command-line options and environment for pip's configuration."""
    options = ["--index-strategy", "unsafe-best-match"]
    for key, flag in REPEATED.items():
        for value in config.get(key, "").split():
            options += [flag, value]
    for key, flag in SINGLE.items():
        if key in config:
            options += [flag, config[key]]
    if config.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    env = {"SSL_CERT_FILE": config["cert"]} if "cert" in config else {}
    return options, env


def find_uv() -> str | None:
    """uv beside this interpreter (scripts/bootstrap.sh installs it in .venv), else on PATH."""
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.exists() else shutil.which("uv")


def uv_pip(uv: str, command: str, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`uv pip COMMAND`, pip's configuration given to resolving commands (install, compile), ARGS after it; its
    output captured."""
    options: list[str] = []
    env: dict[str, str] = {}
    if command in ("install", "compile"):
        listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
        options, env = uv_options(pip_config(listed.stdout if listed.returncode == 0 else ""))  # no pip: no config
    return subprocess.run([uv, "pip", command, *options, *args], env={**os.environ, **env}, input=stdin,
                          capture_output=True, text=True)
