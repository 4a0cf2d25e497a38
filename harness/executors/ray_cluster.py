"""The driver side of the Ray executor (`--executor ray`): each engine worker is an actor (harness.executors.ray_host)
on whichever node has the resources its plan asks for; harness.executors.engine_runs drives it exactly like a local
worker, so the driver journals every result and writes the run directory as a local run does.

Nothing secret goes through Ray: no runtime environment is set, so a worker sees its node's own environment (an API
key is named by its variable, which must be set on the node), and messages carry no environment values.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from harness.core.errors import ConfigError, EngineUnavailable
from harness.executors.local_process import WorkerGone, WorkerTimeout
from harness.executors.ray_host import GONE, TIMEOUT, EngineHost, parity_version
from harness.plan.plans import EnginePlan
from harness.plan.resources import ActorResources, fits
from harness.rundir.store import write_json

CHUNK = 16 * 1024 * 1024  # traces and logs are copied from a node in pieces of this size, never whole in memory
CALL_SLACK = 60.0  # seconds a relayed call may take beyond the worker's own timeout
LOCAL_OBJECT_STORE = 256 * 1024 * 1024  # a Ray instance started here only relays messages and file pieces


def _check_listening(address: str, ray: Any) -> None:
    """ray.init waits minutes on an address where nothing listens; a TCP connect says so in seconds. Ray itself
    replaces a loopback host with this node's address, so both are tried."""
    if address == "auto":
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--ray-address {address}: expected auto, HOST:PORT (the GCS of `ray start --head`) or "
                          "ray://HOST:PORT (a Ray client server)")
    hosts = [host] + ([ray.util.get_node_ip_address()] if host in ("127.0.0.1", "localhost") else [])
    for candidate in hosts:
        with contextlib.suppress(OSError), socket.create_connection((candidate, int(port)), timeout=5):
            return
    raise ConfigError(f"--ray-address {address}: nothing listens there: start a cluster with `ray start --head` "
                      "and pass the address it prints, or drop --ray-address to start one on this machine")


def _ray():
    try:
        import ray
    except ImportError:
        raise EngineUnavailable("--executor ray needs Ray: pip install 'llm-parity[ray]' (or "
                                "scripts/bootstrap.sh, which installs it)") from None
    return ray


class RayExecutor:
    """Workers as actors of a Ray cluster; engines run at once as resources allow."""

    name = "ray"
    workers = None  # an actor is placed for one engine's resources

    def __init__(self, started_here: bool):
        self.started_here = started_here  # a Ray instance of this machine: every path is shared with the nodes
        self.host_class = _ray().remote(EngineHost)

    @classmethod
    def connect(cls, address: str | None) -> RayExecutor:
        ray = _ray()
        started_here = address is None
        if address is not None:
            _check_listening(address, ray)
        if started_here:
            # this checkout's code for the actors, which Ray starts from this process's environment
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_project_root()),
                                                                     os.environ.get("PYTHONPATH")]))
        try:
            # "local": a new instance even where `ray start` left one running (ray.init(None) would attach to it)
            ray.init(address=address or "local", include_dashboard=False, log_to_driver=False, configure_logging=False,
                     num_cpus=os.cpu_count() if started_here else None,
                     object_store_memory=LOCAL_OBJECT_STORE if started_here else None)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            hint = ("; a cluster with token authentication (Ray's default) answers Ray client only with "
                    "RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN, or ~/.ray/auth_token) set here"
                    if str(address).startswith("ray://") and "RAY_AUTH_MODE" not in os.environ else "")
            raise ConfigError(f"--ray-address {address}: cannot attach to a Ray cluster there "
                              f"({' '.join(str(exc).split())[:200]}){hint}: start one with `ray start --head`, or "
                              "drop --ray-address to start one on this machine") from None
        return cls(started_here)

    def close(self) -> None:
        _ray().shutdown()  # a cluster started here stops; an attached one keeps running, minus this run's actors

    def worker(self, plan: EnginePlan) -> RayWorker:
        return RayWorker(plan, self)

    def parallel(self, plans: list[EnginePlan]) -> int:
        return max(1, len(plans))  # Ray holds back actors that do not fit yet

    def check(self, needs: dict[str, ActorResources]) -> None:
        for name, resources in needs.items():
            if not self.feasible(resources.amounts()):
                raise EngineUnavailable(f"engine {name}: no node of the Ray cluster has {resources} "
                                        f"(nodes: {'; '.join(self.describe_nodes())}): change its resources: block "
                                        "or add such a node")

    def alive_nodes(self) -> list[dict[str, Any]]:
        return [n for n in _ray().nodes() if n.get("Alive")]

    def feasible(self, needed: dict[str, float]) -> bool:
        return any(fits(needed, node["Resources"]) for node in self.alive_nodes())

    def describe_nodes(self) -> list[str]:
        return [f"{n['NodeManagerAddress']}: " + ", ".join(f"{k} {v:g}" for k, v in sorted(n["Resources"].items())
                                                         if "node:" not in k and "memory" not in k)
                for n in self.alive_nodes()]


def _project_root() -> Path:
    from harness.core.paths import PROJECT_ROOT

    return PROJECT_ROOT


class RayWorker:
    """One engine worker as an actor, seen through the same calls as a local worker process."""

    def __init__(self, plan: EnginePlan, executor: RayExecutor):
        self.plan, self.executor = plan, executor
        self.actor = None
        self.node = "(not placed yet)"
        self.scratch: Path | None = None  # the actor's folder on its node
        self.in_call = False
        self.killed = False
        self._pid: int | None = None
        self.spawned_at: float | None = None

    @property
    def pid(self) -> int | None:
        return self._pid

    def start(self) -> None:
        ray, plan = _ray(), self.plan
        asked = time.monotonic()
        self.actor = self.executor.host_class.options(max_restarts=0, **plan.resources.ray_options()).remote(
            plan.name, plan.python, plan.threads, _modules(plan.import_paths), plan.workdir.parent.parent.name)
        placed = self.actor.describe.remote()
        while not ray.wait([placed], timeout=2.0)[0]:  # waiting for resources is normal; none anywhere is not
            if self.killed:
                raise WorkerGone("stopped before the actor was placed")
            if not self.executor.feasible(plan.resources.amounts()):
                raise WorkerGone(f"no live node of the Ray cluster has {plan.resources}")
        info = self._call(placed, None)
        waited = time.monotonic() - asked  # for resources to free up, then for the actor's process to start
        self.node, self.scratch = info["host"], Path(info["scratch"])
        if info["version"] != parity_version():
            raise WorkerGone(f"node {self.node} has llm-parity {info['version']}, the driver {parity_version()}: "
                             "install the same version on every node")
        model_path = self._call(self.actor.prepare_model.remote(
            plan.model, plan.dtype, plan.model_shared or self.executor.started_here), plan.load_timeout)
        self._pid, self.spawned_at = self._call(self.actor.start_worker.remote(), CALL_SLACK)
        self._record({**info, "model_path": model_path, "worker_pid": self._pid,
                      "resources": str(plan.resources), "placed_after_s": round(waited, 3)})

    def send(self, message: dict[str, Any]) -> None:
        gone = self._call(self._live().send.remote(message), CALL_SLACK)
        if gone:
            raise WorkerGone(gone)

    def receive(self, timeout: float) -> dict[str, Any]:
        message = self._call(self._live().receive.remote(timeout), timeout + CALL_SLACK)
        if message["event"] == GONE:
            raise WorkerGone(message["error"])
        if message["event"] == TIMEOUT:
            raise WorkerTimeout(message["error"])
        if message["event"] == "result" and message["result"].get("path"):
            message["result"]["path"] = str(self._fetch(message["result"]["path"]))
        return message

    def _live(self) -> Any:
        """The actor, or WorkerGone once it was killed: a Ctrl-C kills actors from the main thread while an engine's
        thread may be between two calls to its actor."""
        actor = self.actor
        if actor is None:
            raise WorkerGone("the actor was stopped (the run was interrupted)")
        return actor

    def stop(self, grace: float = 30.0) -> None:
        if self.actor is None:  # killed already
            return
        try:
            self._call(self._live().stop.remote(grace), grace + CALL_SLACK)
            self._collect()
        except (WorkerGone, WorkerTimeout):
            pass
        finally:
            self._end()

    def kill(self) -> None:
        """Kill the worker and its actor. While a call is in flight (Ctrl-C) there is no waiting on the actor: it
        is killed at once, and its worker and any server it started die with it (they die with their parent)."""
        self.killed = True
        if self.actor is not None and not self.in_call:
            try:
                self._call(self._live().kill_worker.remote(), 20.0)
                self._collect()
            except (WorkerGone, WorkerTimeout):
                pass
        self._end()

    def _end(self) -> None:
        if self.actor is not None:
            with contextlib.suppress(Exception):  # the cluster itself may be gone by now: nothing is left to stop
                _ray().kill(self.actor, no_restart=True)
            self.actor = None

    def _collect(self) -> None:
        """Append the worker's log from the node to engines/<name>/worker.log, then free the node's scratch."""
        try:
            if self._pid is not None:
                self._copy(str(self.scratch / "engine" / "worker.log"), self.plan.workdir / "worker.log", append=True)
        finally:
            self._call(self._live().cleanup.remote(), CALL_SLACK)

    def _fetch(self, node_path: str) -> Path:
        """A trace the worker wrote on its node, copied to the same place under the run directory."""
        target = self.plan.workdir / Path(node_path).relative_to(self.scratch / "engine")
        target.parent.mkdir(parents=True, exist_ok=True)
        self._copy(node_path, target, append=False)
        return target

    def _copy(self, node_path: str, target: Path, append: bool) -> None:
        with open(target, "ab" if append else "wb") as out:
            offset = 0
            while True:
                piece = self._call(self._live().read.remote(node_path, offset, CHUNK), CALL_SLACK)
                out.write(piece)
                offset += len(piece)
                if len(piece) < CHUNK:
                    return

    def _record(self, info: dict[str, Any]) -> None:
        """engines/<name>/actor.json: where each of this engine's actors ran (node, pids, scratch folder)."""
        self.plan.workdir.mkdir(parents=True, exist_ok=True)
        path = self.plan.workdir / "actor.json"
        earlier = json.loads(path.read_text()) if path.exists() else []
        write_json(path, [*earlier, {**info, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}])

    def _call(self, ref, timeout: float | None) -> Any:
        """The value of an actor call; the actor's death is WorkerGone (with Ray's reason), no answer in time is
        WorkerTimeout, an error raised on the node is WorkerGone with its message."""
        ray = _ray()
        self.in_call = True
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise WorkerTimeout(f"the actor on {self.node} gave no answer within {timeout:g}s") from None
        except ray.exceptions.RayActorError as exc:
            raise WorkerGone(f"the Ray actor on {self.node} died: {_why(exc)}") from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            raise WorkerGone(f"on node {self.node}: {' '.join(str(cause).split())[:400]}") from None
        finally:
            self.in_call = False


def _why(exc: Exception) -> str:
    """Ray's reason for an actor's death in one line: its message without the field list (class_name, actor_id,
    pid, ...) that Ray puts between the first line and the cause."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    reason = [line.strip() for line in lines[1:] if not line.startswith("\t")]
    return " ".join(" ".join(reason or lines[:1]).split())[:400]


def _modules(import_paths: list[str]) -> dict[str, str]:
    """The Python modules at the top of the scenario's folder (a model patch), sent to the node by value."""
    modules = {}
    for folder in map(Path, import_paths):
        for path in sorted(folder.glob("*.py")):
            modules[path.name] = path.read_text()
    return modules
