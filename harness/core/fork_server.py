"""A process that imports torch, transformers and vLLM once and forks engine workers from there, for many commands.

Every worker process otherwise starts by importing torch and its engine package: about 9 s of CPU for HF and 8 s for
vLLM on a 2-core machine, more than loading and running SmolLM2. `parity fork-server SOCKET` pays that once; a command
whose environment names the socket (LLM_PARITY_FORK_SERVER) asks it for each engine worker and each run of an engine's
sampling code (harness.core.forked_process) and gets a fresh process forked from the imported state, with the
command's own environment, folder, stdin, stdout and stderr. Nothing of one worker reaches another: each is a new
process, and the server itself never runs an engine.

The server stays single-threaded (forking a threaded process can copy a held lock) and never runs a torch operation,
so no OpenMP thread pool exists to be copied: each worker makes its own with its own thread count.

Protocol, one connection per worker: the command sends one JSON line {"module", "args", "env", "cwd", "python",
"harness_pid"} with three file descriptors (stdin, stdout, stderr); the server answers {"pid": N} (or {"refused": why}:
spawn it yourself), and later {"exit": code} when that worker ends, code as subprocess gives it (negative: killed by a
signal).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.core.processes import die_with_parent, exit_before_finalisation, worker_env

ENV_VAR = "LLM_PARITY_FORK_SERVER"
# what HF and vLLM workers and the engines' sampling code import; a module not installed here is skipped. Measured
# after torch, transformers and vllm (AVX2 EPYC): vllm.LLM's module 6.6-8.8 s of CPU, HF's Llama model 1.1 s, vLLM's
# Llama model and CPU model runner 0.4 s each; none starts a thread
PRELOAD = ("torch", "transformers", "transformers.models.auto.modeling_auto", "transformers.generation",
           "transformers.models.llama.modeling_llama", "vllm", "vllm.entrypoints.llm",
           "vllm.model_executor.models.llama", "vllm.v1.worker.cpu_model_runner")
MAX_REQUEST = 1 << 20  # bytes: the environment dominates a request


def serve(socket_path: Path, preload: tuple[str, ...] = PRELOAD) -> int:
    """Import `preload`, then answer fork requests on socket_path until SIGTERM, SIGINT or the parent's death."""
    die_with_parent()
    imported = []
    with _notices_discarded():
        for module in preload:
            with contextlib.suppress(ImportError):
                importlib.import_module(module)
                imported.append(module)
    gc.collect()
    gc.freeze()  # the imports' objects: never traversed again by a worker's collections, shared copy-on-write
    socket_path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    listener.listen(16)
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopping.append(signum))
    print(f"fork server: ready on {socket_path} ({', '.join(imported)} imported)", flush=True)
    waiting: dict[int, socket.socket] = {}  # worker pid -> the connection to tell of its exit
    server = os.getpid()
    try:
        while not stopping:
            with contextlib.suppress(InterruptedError):
                readable, _, _ = select.select([listener], [], [], 0.2)
                if readable:
                    connection, _ = listener.accept()
                    connection.settimeout(10)  # a command that connects and says nothing cannot stall the others
                    forked = _fork_for(connection, listener, waiting)
                    if forked is not None:  # this is the worker now
                        return _run_module(*forked)
            _reap(waiting)
        return 0
    finally:
        if os.getpid() == server:
            listener.close()
            socket_path.unlink(missing_ok=True)


@contextlib.contextmanager
def _notices_discarded() -> Iterator[None]:
    """Standard output and error go nowhere meanwhile: what the imports log at import time (vLLM's "Triton is
    installed, but doesn't include CPU backend") is not the server's output. An exception still reaches stderr."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 1)
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for target, fd in enumerate(saved, start=1):
            os.dup2(fd, target)
            os.close(fd)


def _fork_for(connection: socket.socket, listener: socket.socket,
              waiting: dict[int, socket.socket]) -> tuple[str, list[str]] | None:
    """Read a request and fork its worker: in the worker, the module to run and its arguments; in the server, None."""
    fds: list[int] = []
    try:
        message, fds, _, _ = socket.recv_fds(connection, MAX_REQUEST, 3)
        while message and not message.endswith(b"\n"):  # a stream: the line may come in pieces
            piece = connection.recv(MAX_REQUEST)
            if not piece:
                raise ValueError("the command closed the connection mid-request")
            message += piece
        request = json.loads(message)
        refusal = _refusal(request, fds)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a command gone mid-request, or another protocol
        refusal = f"unreadable request: {exc}"
    if refusal:
        for fd in fds:
            os.close(fd)
        _tell(connection, {"refused": refusal})
        connection.close()
        return None
    pid = os.fork()
    if pid == 0:
        for other in (listener, connection, *waiting.values()):
            other.close()
        _become_worker(request, fds)
        return request["module"], request.get("args", [])
    for fd in fds:
        os.close(fd)
    waiting[pid] = connection
    _tell(connection, {"pid": pid})
    return None


def _tell(connection: socket.socket, message: dict[str, Any]) -> None:
    """One line to a command, which may have gone meanwhile (its worker then ends too: _end_with)."""
    with contextlib.suppress(OSError):
        connection.sendall((json.dumps(message) + "\n").encode())


def _refusal(request: dict[str, Any], fds: list[int]) -> str | None:
    if len(fds) != 3 or not isinstance(request.get("module"), str):
        return f"expected a module and 3 file descriptors, got {len(fds)} descriptors"
    args = request.get("args", [])
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        return "expected the module's arguments as a list of strings"
    if os.path.abspath(request["python"]) != os.path.abspath(sys.executable):  # a venv's python is a link
        return f"this server runs {sys.executable}, the worker needs {request['python']}"
    return None


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = waiting.pop(pid, None)
        if connection is not None:
            _tell(connection, {"exit": os.waitstatus_to_exitcode(status)})
            connection.close()


def _become_worker(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: the session, signals, descriptors, environment and folder a spawned worker would have."""
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a new interpreter sets it: KeyboardInterrupt
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stdin, for its whole life
    print(f"worker forked by the fork server (pid {os.getppid()})", file=sys.stderr, flush=True)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    paths = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[1:1] = paths  # what PYTHONPATH would have put there at start-up
    threads = request["env"].get("OMP_NUM_THREADS")
    if threads and "torch" in sys.modules:  # OpenMP read its environment when the server imported torch
        sys.modules["torch"].set_num_threads(int(threads))
    _end_with(request["harness_pid"])


def _end_with(harness_pid: int) -> None:
    """SIGTERM this worker when the command that asked for it dies (its parent is the server, not the command)."""
    try:
        pidfd = os.pidfd_open(harness_pid)
    except (OSError, AttributeError):
        return

    def watch() -> None:
        select.select([pidfd], [], [])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="harness-watch").start()


def _run_module(module: str, args: list[str]) -> int:
    """Run `module` as `python -m module args...` would, in this forked child; its exit code."""
    sys.argv[1:] = args
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(exit_.code, file=sys.stderr)
        return 1
    except BaseException:  # what `python -m` does with an uncaught exception
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str]) -> int:
    """argv: SOCKET [MODULE ...], the modules to import instead of PRELOAD."""
    if not argv:
        print("usage: python -m harness.core.fork_server SOCKET [MODULE ...]", file=sys.stderr)
        return 2
    # what a spawned worker starts with, before anything reads it: OpenMP's wait policy, transformers' offline mode
    os.environ.update(worker_env(threads=1))
    exit_before_finalisation(serve(Path(argv[0]), tuple(argv[1:]) or PRELOAD))  # the server, or a worker forked here


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
