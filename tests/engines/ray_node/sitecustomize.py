"""Loaded at start-up by every Python process of a test Ray node (its PYTHONPATH names this folder): when
LLM_PARITY_TEST_FORBIDDEN lists path prefixes (the driver's run directory and model cache), each file the process
opens under one of them is appended to LLM_PARITY_TEST_OPENS, so a test can show that a node read nothing of the
driver's."""

import os
import sys

_FORBIDDEN = [p for p in os.environ.get("LLM_PARITY_TEST_FORBIDDEN", "").split(os.pathsep) if p]
_LOG = os.environ.get("LLM_PARITY_TEST_OPENS", "")
_busy = False


def _record(event: str, args: tuple) -> None:
    global _busy
    if event != "open" or _busy or not args or not isinstance(args[0], str | bytes | os.PathLike):
        return
    path = os.path.abspath(os.fsdecode(args[0]))
    if not any(path.startswith(prefix) for prefix in _FORBIDDEN):
        return
    _busy = True  # writing the log opens a file too
    try:
        fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{os.getpid()} {path}\n".encode())
        os.close(fd)
    finally:
        _busy = False


if _FORBIDDEN and _LOG:
    sys.addaudithook(_record)
