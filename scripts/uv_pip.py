"""Run `uv pip ARGS` for the virtual environment this interpreter belongs to, under the machine's pip configuration.

uv installs the project's ~200 wheels in seconds where pip takes minutes, but it reads no pip.conf: the indexes,
find-links folders, constraints and certificate a machine configured for pip (in its files or PIP_* variables, as
`pip config list` reports them) are passed to uv here, so both tools install the same releases from the same places.
uv picks the best version across all of them, as pip does. Usage: python scripts/uv_pip.py install|uninstall ...
"""

from __future__ import annotations

import os
import shlex
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


def main(args: list[str]) -> int:
    command, rest = args[0], args[1:]
    options, env = [], {}
    if command == "install":
        listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                                 check=True).stdout
        options, env = uv_options(pip_config(listing))
    uv = Path(sys.executable).with_name("uv")
    return subprocess.run([str(uv), "pip", command, "--python", sys.executable, *options, *rest],
                          env={**os.environ, **env}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
