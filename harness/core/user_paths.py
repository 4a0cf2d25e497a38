"""Paths a user passes (a model folder, --out, --baseline, a run directory): what the operating system would answer
about them, said in words before a command uses them, so that bad input is one line and never a traceback.

Each *_problem function returns None for a usable path, else the reason as a phrase that follows the path ("is a
file, not a folder"); the caller adds the option or key it came from and the fix.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from harness.core.errors import ConfigError

SHOWN_CHARS = 80  # a path or name longer than this is shown cut, with its length

_OS_REASONS = {
    errno.ENAMETOOLONG: "is longer than the file system allows for a name",
    errno.ELOOP: "is a symbolic link loop",
    errno.EACCES: "cannot be used (permission denied)",
    errno.EPERM: "cannot be used (operation not permitted)",
    errno.EROFS: "is on a read-only file system",
    errno.ENOTDIR: "goes through a file as if it were a folder",
    errno.ENOENT: "does not exist",
    errno.ENOSPC: "is on a full disk",
}


def shown(text: str | Path) -> str:
    """A path or name as an error message quotes it: cut when long, control characters escaped."""
    text = str(text)
    cut = text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)


def os_reason(exc: OSError) -> str:
    """An OSError as the phrase that follows the path it is about."""
    return _OS_REASONS.get(exc.errno or 0, f"cannot be used ({exc.strerror or exc})")


NAME_MAX, PATH_MAX = 255, 4096  # what Linux file systems take (bytes): a name longer than these is refused anywhere


def name_problem(path: Path | str) -> str | None:
    """Why no file system would take this path, from the string alone (nothing is touched), or None."""
    text = str(path)
    if "\0" in text:
        return "holds a NUL byte, which no file name can"
    if not text.strip():
        return "is empty"
    try:
        encoded = os.fsencode(text)
    except UnicodeEncodeError:
        return "holds characters no file name can (a lone surrogate)"
    if len(encoded) > PATH_MAX or any(len(part) > NAME_MAX for part in encoded.split(b"/")):
        return "is longer than the file system allows for a name"
    return None


def expanded(path: Path) -> Path:
    """path with ~ expanded; as given when ~user names no user of this machine."""
    try:
        return path.expanduser()
    except RuntimeError:  # ~user with no such user
        return path


def folder_to_read_problem(path: Path) -> str | None:
    """Why `path` is not an existing folder this process can list, or None."""
    problem = name_problem(path)
    if problem:
        return problem
    try:
        if expanded(path).is_dir():
            return None if os.access(expanded(path), os.R_OK | os.X_OK) else "cannot be read (permission denied)"
        os.stat(expanded(path))
    except OSError as exc:
        return os_reason(exc)
    return "is a file, not a folder"


def _existing_ancestor(path: Path) -> tuple[Path, str | None]:
    """The nearest part of `path` that exists (itself included), or the reason the walk could not go on."""
    probe = path
    while True:
        try:
            os.stat(probe)
            return probe, None
        except FileNotFoundError:
            if probe.parent == probe:
                return probe, "does not exist"
            probe = probe.parent
        except OSError as exc:
            return probe, os_reason(exc)


def to_write_problem(path: Path, folder: bool) -> str | None:
    """Why a folder (folder=True) or a file cannot be written at `path` (created with its missing parents), or
    None. Nothing is created."""
    problem = name_problem(path)
    if problem:
        return problem
    target = expanded(path).absolute()
    existing, problem = _existing_ancestor(target)
    if problem:
        return problem
    if existing == target:
        if folder and not target.is_dir():
            return "is a file, not a folder"
        if not folder and target.is_dir():
            return "is a folder, not a file"
        writable = target if folder else target.parent
        return None if os.access(writable, os.W_OK) else "cannot be written (permission denied)"
    if not existing.is_dir():
        return f"goes through {shown(existing)}, a file, as if it were a folder"
    return None if os.access(existing, os.W_OK | os.X_OK) else \
        f"cannot be created in {shown(existing)} (permission denied)"


def file_to_read_problem(path: Path) -> str | None:
    """Why `path` is not an existing file this process can read, or None."""
    problem = name_problem(path)
    if problem:
        return problem
    try:
        os.stat(expanded(path))
    except OSError as exc:
        return os_reason(exc)
    if expanded(path).is_dir():
        return "is a folder, not a file"
    return None if os.access(expanded(path), os.R_OK) else "cannot be read (permission denied)"


def check_option(option: str, path: Path | None, problem_of: Callable[[Path], str | None], fix: str) -> None:
    """Raise the one-line ConfigError `OPTION PATH: problem: fix` when problem_of(path) finds one (None: not given)."""
    problem = problem_of(path) if path is not None else None
    if problem:
        raise ConfigError(f"{option} {shown(path)}: {problem}: {fix}")
