"""The fork server's protocol with a light preload (json instead of torch): a forked `python -m` gets the command's
stdin, stdout, environment and folder, its exit code or killing signal comes back, and a worker for another
interpreter, or with no server listening, is left to the usual spawn (None)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.http.server_process import ServerProcess, free_port
from harness.core.fork_server import ENV_VAR
from harness.core.forked_process import ForkedProcess, fork_worker, run_module
from harness.core.processes import group_alive


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    socket_path = tmp_path_factory.mktemp("fork") / "server.sock"
    process = subprocess.Popen([sys.executable, "-m", "harness.core.fork_server", str(socket_path), "json"],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().startswith("fork server: ready")
    yield socket_path
    process.terminate()
    assert process.wait(10) == 0
    assert not socket_path.exists()


@pytest.fixture
def named(server, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(server))


def forked(module: str, tmp_path: Path, env: dict[str, str] | None = None, python: str = sys.executable):
    read_fd, write_fd = os.pipe()
    with open(tmp_path / "stderr", "ab") as stderr:
        process = fork_worker(module, env or dict(os.environ), tmp_path, python, write_fd, stderr.fileno())
    os.close(write_fd)
    return process, os.fdopen(read_fd)


def test_forked_module_reads_stdin_and_writes_stdout(named, tmp_path):
    process, stdout = forked("json.tool", tmp_path)
    process.stdin.write('{"a": [1]}\n')
    process.stdin.close()
    assert stdout.read() == '{\n    "a": [\n        1\n    ]\n}\n'
    assert process.wait(10) == 0


def test_forked_module_has_the_commands_environment_and_folder(named, tmp_path):
    (tmp_path / "probe.py").write_text("import os, sys\nprint(os.getcwd(), os.environ['PROBE'])\nsys.exit(3)\n")
    env = {**os.environ, "PROBE": "yes", "PYTHONPATH": str(tmp_path)}
    process, stdout = forked("probe", tmp_path, env)
    assert stdout.read() == f"{tmp_path} yes\n"
    assert process.wait(10) == 3


def test_killed_worker_reports_the_signal(named, tmp_path):
    process, _ = forked("json.tool", tmp_path)  # waits on its stdin
    time.sleep(0.2)
    assert process.poll() is None
    os.killpg(process.pid, signal.SIGKILL)  # the worker leads a session of its own, as a spawned one does
    assert process.wait(10) == -signal.SIGKILL


def test_other_interpreter_is_left_to_spawn(named, tmp_path):
    process, _ = forked("json.tool", tmp_path, python="/usr/bin/python3")
    assert process is None


def test_no_server_listening_is_left_to_spawn(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nobody.sock"))
    assert forked("json.tool", tmp_path)[0] is None


def test_run_module_captures_output_and_exit_code(named, tmp_path):
    (tmp_path / "shout.py").write_text("import sys\nprint(sys.stdin.read().upper())\nprint('bye', file=sys.stderr)\n"
                                       "sys.exit(4)\n")
    done = run_module(sys.executable, "shout", "hello", 10, {**os.environ, "PYTHONPATH": str(tmp_path)}, tmp_path)
    assert (done.returncode, done.stdout) == (4, "HELLO\n")
    assert done.stderr.startswith("worker forked by the fork server") and done.stderr.endswith("\nbye\n")


def test_run_module_spawns_without_a_server(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_VAR, raising=False)
    done = run_module(sys.executable, "json.tool", '{"a":1}', 30, dict(os.environ), tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, '{\n    "a": 1\n}\n', "")


def test_run_module_past_its_timeout_is_killed(named, tmp_path):
    (tmp_path / "sleepy.py").write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_module(sys.executable, "sleepy", "", 0.5, {**os.environ, "PYTHONPATH": str(tmp_path)}, tmp_path)


def test_a_garbled_request_is_refused_and_the_server_serves_on(server, named, tmp_path):
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as garbled:
        garbled.connect(str(server))
        garbled.sendall(b"not json\n")
        assert b"refused" in garbled.recv(1000)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as gone:  # a command that dies mid-request
        gone.connect(str(server))
        gone.sendall(b'{"module": ')
    process, stdout = forked("json.tool", tmp_path)
    process.stdin.write("[1]\n")
    process.stdin.close()
    assert stdout.read() == "[\n    1\n]\n" and process.wait(10) == 0


def test_a_server_command_is_forked_with_its_arguments_and_stopped_with_its_group(named, tmp_path):
    port = free_port()
    server = ServerProcess([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)], dict(os.environ),
                           tmp_path / "server.log", tmp_path / "server.pid")
    assert isinstance(server.process, ForkedProcess)
    assert server.wait_ready(f"http://127.0.0.1:{port}/", timeout=30) >= 0  # it got its --bind and port
    assert int((tmp_path / "server.pid").read_text()) == server.process.pid
    server.stop(grace=5)
    assert server.process.poll() == -signal.SIGTERM and not group_alive(server.process.pid)
    assert (tmp_path / "server.log").read_text().startswith("worker forked by the fork server")


def test_arguments_that_are_not_a_list_of_strings_are_refused():
    from harness.core.fork_server import _refusal

    request = {"module": "json.tool", "python": sys.executable}
    assert _refusal({**request, "args": ["--sort-keys"]}, [0, 1, 2]) is None
    for args in ("--sort-keys", [1], {"a": "b"}):
        assert "list of strings" in _refusal({**request, "args": args}, [0, 1, 2])
