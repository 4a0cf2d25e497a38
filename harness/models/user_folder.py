"""A `model:` that is a path: whether it names an HF folder the engines can load, said in one line, never raised.

Everything the operating system can answer about a path (a name too long, a NUL byte, a symlink loop, no permission,
a file where a folder belongs) becomes a phrase, so that every command that reads a scenario gives the same
`file:line: model: ...` error before anything else touches the path.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.core.user_paths import expanded, folder_to_read_problem, os_reason
from harness.models.config_values import config_problem


def folder_problem(model: str) -> str | None:
    """Why `model` is not a readable folder holding a config.json object, or None when it is."""
    problem = folder_to_read_problem(Path(model))
    if problem:
        return problem
    config = expanded(Path(model)) / "config.json"
    try:
        if not config.is_file():
            return "has a config.json that is not a file" if config.exists() else \
                "is a folder without config.json, not an HF model folder"
        data = json.loads(config.read_bytes())
    except OSError as exc:
        return f"has a config.json that {os_reason(exc)}"
    except ValueError:
        return "has a config.json that is not JSON"
    if not isinstance(data, dict):
        return "has a config.json that is not a JSON object"
    odd = config_problem(data)
    return odd and f"has a config.json whose {odd}: fix that value"


def read_config(folder: Path) -> dict:
    """config.json of a folder folder_problem() accepted, or {} if it has changed since."""
    try:
        data = json.loads((folder / "config.json").read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
