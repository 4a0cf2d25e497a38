"""Forward hooks that capture canonical points (harness.core.points) from an engine's model during one
teacher-forced pass and stream them to a TraceWriter. Which module yields which point is an architecture map
(adapters.tracing.hf_maps, vllm_maps); this file only knows how to hook, split fused outputs and collect rows.

Hooks are registered once after the engine has loaded and stay idle (a flag check) outside a traced pass, so
warm-up runs and ordinary generation are not captured. Engines that flatten the batch ([tokens, width], vLLM) and
engines that keep it ([1, seq, width], HF; per-head tensors [1, heads, seq, dim]) all end up as [positions, width]; a
point delivered in several chunks (chunked prefill, logits computed in two calls or in slices) is streamed to the
writer chunk by chunk until it has one row per position (the logits: one per position from the prompt's last,
see harness.rundir.traces.Trace). A point can be muted while the engine computes it for
its own purposes (vLLM's sampler computes the last position's logits), and a point can be kept in memory for the
adapter to compute another from (vLLM's logits, from the final norm's rows, a slice at a time).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from adapters.tracing.arch_maps import ArchMap, Tap
from adapters.tracing.forcing import LayerInputs
from adapters.tracing.routes import RouteCapture
from adapters.tracing.writer import TraceWriter
from harness.core.points import layer_point
from harness.core.types import TraceRequest, TraceResult
from harness.rundir.traces import trace_file_name

LOGITS_SLICE = 64  # positions whose logits a traced pass computes at once (64 MB at a 262k vocabulary)
Derive = Callable[[str, Any], list[tuple[str, Any]]]  # (point name, tensor) -> extra points computed from it


class Capture:
    def __init__(self, model: Any, arch: ArchMap, sizes: dict[str, int], num_layers: int,
                 derive: Derive | None = None):
        self.model, self.arch, self.sizes, self.num_layers = model, arch, sizes, num_layers
        self.derive = derive
        self.writer: TraceWriter | None = None
        self.only: set[str] | None = None
        self.muted: set[str] = set()
        self.keep: dict[str, list[Any]] = {}  # point name -> its rows of this pass (begin(keep=...))
        self.positions = 0
        self.logits_from = 0
        self.pending: set[str] = set()  # points streamed in chunks, not yet complete
        self.handles: list[Any] = []
        self._attach()
        self.routes = RouteCapture(model, arch.layers, arch.routes, num_layers) if arch.routes else None
        self.routing = False  # this pass collects the chosen experts (a full pass of a mixture-of-experts model)

    def _attach(self) -> None:
        modules = dict(self.model.named_modules())
        for tap in self.arch.before + self.arch.after:
            self._hook(modules, tap, tap.module, tap.points)
        for layer in range(self.num_layers):
            prefix = f"{self.arch.layers}.{layer}"
            for tap in self.arch.per_layer:
                path = f"{prefix}.{tap.module}" if tap.module else prefix
                self._hook(modules, tap, path, tuple(layer_point(layer, p) for p in tap.points))

    def _hook(self, modules: dict[str, Any], tap: Tap, path: str, names: tuple[str, ...]) -> None:
        module = modules.get(path)
        if module is None:
            raise RuntimeError(f"trace: the model has no module {path} (architecture map {self.arch.name})")
        if tap.take in ("input", "inputs"):
            self.handles.append(module.register_forward_pre_hook(
                lambda _m, args, names=names, tap=tap: self._on_inputs(tap, names, args)))
        else:
            self.handles.append(module.register_forward_hook(
                lambda _m, _args, output, names=names, tap=tap: self._on_output(tap, names, output)))

    def _on_output(self, tap: Tap, names: tuple[str, ...], output: Any) -> None:
        if self.writer is None:
            return
        if tap.take == "sum":
            self._on_tensor(tap, names, output[0] + output[1])
        elif tap.take == "each":
            for name, tensor in zip(names, output, strict=False):
                self._emit(name, tensor, tap)
        else:
            self._on_tensor(tap, names, output[0] if isinstance(output, (tuple, list)) else output)

    def _on_inputs(self, tap: Tap, names: tuple[str, ...], args: tuple) -> None:
        if self.writer is None:
            return
        tensors = [a for a in args if hasattr(a, "shape")]
        if tap.take == "input":
            self._on_tensor(tap, names, tensors[tap.arg])
            return
        for name, tensor in zip(names, tensors, strict=False):
            self._emit(name, tensor, tap)

    def _on_tensor(self, tap: Tap, names: tuple[str, ...], tensor: Any) -> None:
        if self.writer is None:
            return
        if not tap.split:
            self._emit(names[0], tensor, tap)
            return
        sizes = [self.sizes[s] for s in tap.split]
        for name, part in zip(names, tensor.split(sizes, dim=-1), strict=False):
            self._emit(name, part, tap)

    def _emit(self, name: str, tensor: Any, tap: Tap) -> None:
        if name in self.muted:
            return
        self.deliver(name, _rows(tensor, tap))

    def deliver(self, name: str, rows: Any) -> None:
        """A point's rows [positions, width] (or a chunk of them), from a hook or computed by the adapter."""
        if name in self.keep:
            self.keep[name].append(rows.detach().clone())
        if not self.wants(name):
            return
        if name in self.pending or rows.shape[0] < self.expected(name):
            self._stream(name, rows)
            return
        if rows.shape[0] != self.expected(name):
            raise RuntimeError(f"trace: {name} has {rows.shape[0]} rows for {self.expected(name)} positions")
        writer = self._pass_writer()
        writer.add(name, rows)
        if self.derive is not None:
            for extra, value in self.derive(name, rows):
                writer.add(extra, value)

    def _stream(self, name: str, rows: Any) -> None:
        """A point delivered in chunks of positions: each chunk goes to the writer as it comes, so a point is never
        whole in memory (a 262k-vocabulary logits tensor is 1 MB a row). Chunked points get no derived points."""
        self.pending.add(name)
        writer = self._pass_writer()
        writer.append(name, rows)
        done = writer.rows(name)
        if done < self.expected(name):
            return
        self.pending.discard(name)
        if done != self.expected(name):
            raise RuntimeError(f"trace: {name} has {done} rows for {self.expected(name)} positions")

    def _pass_writer(self) -> TraceWriter:
        """The writer of the pass under way (begin() to end())."""
        if self.writer is None:
            raise RuntimeError("trace: a point delivered outside a traced pass (begin() to end())")
        return self.writer

    def expected(self, name: str) -> int:
        """Rows a point has in this pass."""
        return self.positions - self.logits_from if name == "logits" else self.positions

    def begin(self, writer: TraceWriter, positions: int, only: list[str] | None = None,
              keep: tuple[str, ...] = (), logits_from: int = 0) -> None:
        self.writer, self.positions, self.logits_from, self.pending = writer, positions, logits_from, set()
        self.only = set(only) if only is not None else None
        self.routing = self.routes is not None and only is None
        if self.routes is not None and self.routing:
            self.routes.begin()
            keep = (*keep, *RouteCapture.router_points(self.num_layers))
        self.keep = {name: [] for name in keep}

    def wants(self, name: str) -> bool:
        return self.only is None or name in self.only

    @contextmanager
    def mute(self, *names: str) -> Iterator[None]:
        """Ignore these points while the engine computes them for itself (not for every position)."""
        self.muted = set(names)
        try:
            yield
        finally:
            self.muted = set()

    def end(self, trace: Path, metadata: dict[str, str]) -> Path | None:
        """Close the pass; where it collected the chosen experts, write their table beside the trace (its path)."""
        incomplete = {name: self._pass_writer().rows(name) for name in self.pending}
        keep, routing = self.keep, self.routing
        self.writer, self.pending, self.keep, self.routing = None, set(), {}, False
        if incomplete:
            raise RuntimeError(f"trace: points captured for only part of the positions: {incomplete}")
        return self.routes.end(trace, self.positions, keep, metadata) if routing and self.routes else None

    def abort(self) -> None:
        """A pass that failed: nothing of it is kept."""
        self.writer, self.pending, self.keep, self.routing = None, set(), {}, False
        if self.routes is not None:
            self.routes.chunks = None

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if self.routes is not None:
            self.routes.close()


def _rows(tensor: Any, tap: Tap) -> Any:
    """One row per position: [positions, width], whatever the engine's layout."""
    if tap.heads_first:
        tensor = tensor[0].transpose(0, 1)  # [1, heads, seq, dim] -> [seq, heads, dim]
    elif tensor.dim() in (3, 4) and tensor.shape[0] == 1:
        tensor = tensor[0]  # HF keeps a batch of one (except where a module flattens it, as OPT's MLP does);
        # per-head tensors: [1, seq, heads, dim] (Qwen 3's q and k norms)
    return tensor.reshape(tensor.shape[0], -1)  # [tokens, heads, dim] -> [tokens, heads*dim]


def logits_start(request: TraceRequest) -> int:
    """The first position whose logits a trace keeps: the prompt's last, which predicts the first generated token."""
    return max(0, request.prompt_len - 1)


def trace_path(workdir: Path, request: TraceRequest) -> Path:
    """Where a request's trace goes: its trace_dir, else the engine's traces folder."""
    folder = Path(request.trace_dir) if request.trace_dir else workdir / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / trace_file_name(request.case_id)


def trace_writer(request: TraceRequest, path: Path, store_dtype: Any) -> Any:
    """A TraceWriter storing every point, or where the request names the reference's trace, a ComparingWriter
    (adapters.tracing.comparing_writer): compared as captured, only metrics and the kept points' rows stored."""
    if request.against is None:
        return TraceWriter(path, store_dtype)
    from adapters.tracing.comparing_writer import ComparingWriter

    return ComparingWriter(path, store_dtype, Path(request.against),
                           None if request.keep is None else set(request.keep))


def trace_result(engine_name: str, request: TraceRequest, path: Path, points: list[str], writer: Any,
                 started: float, routes: Path | None = None) -> TraceResult:
    errors = getattr(writer, "errors_path", None)
    return TraceResult(case_id=request.case_id, engine=engine_name, status="ok", path=str(path), points=points,
                       nonfinite=writer.nonfinite, timings={"trace_s": time.perf_counter() - started},
                       errors=str(errors) if errors else "", routes=str(routes) if routes else "")


class PassCapture(Protocol):
    """What run_traces drives: a Capture, or a ShardedCapture over a tensor-parallel engine's ranks
    (adapters.tracing.ranks)."""

    arch: ArchMap

    def begin(self, writer: Any, positions: int, only: list[str] | None = None, keep: tuple[str, ...] = (),
              logits_from: int = 0) -> None: ...

    def end(self, trace: Path, metadata: dict[str, str]) -> Path | None: ...

    def abort(self) -> None: ...


class PassForcing(Protocol):
    """A LayerInputs, or a ShardedForcing."""

    def begin(self, source: Path) -> None: ...

    def end(self) -> None: ...


def run_traces(engine_name: str, capture: PassCapture, requests: list[TraceRequest], workdir: Path, store_dtype: Any,
               forward: Callable[[list[int], int], None], metadata: dict[str, str],
               keep: tuple[str, ...] = (), after: Callable[[], dict[str, str]] = dict,
               forcing: PassForcing | None = None) -> Iterator[TraceResult]:
    """One teacher-forced pass per request, its capture points streamed to workdir/traces/<case>.safetensors.
    forward(token_ids, logits_from) runs the model and computes the logits from position logits_from on; `keep`:
    points it reads back from capture.keep; `after`: metadata read from the engine once a pass has run (what it
    loads on a first request, as vLLM its adapter); `forcing`: the engine's layer-input hooks, for requests that
    name the reference's trace to start each layer from (inputs_from; None: the engine cannot force its layers and
    runs them free, which its result says)."""
    for request in requests:
        path = trace_path(workdir, request)
        writer = trace_writer(request, path, store_dtype)
        logits_from = logits_start(request)
        source = request.inputs_from if forcing is not None else None
        capture.begin(writer, len(request.token_ids), request.points, keep, logits_from)
        started = time.perf_counter()
        about = {**metadata, "arch": capture.arch.name, "case_id": request.case_id,
                 "forced": str(source is not None).lower()}
        try:
            if forcing is not None and source is not None:
                forcing.begin(Path(source))
            forward(request.token_ids, logits_from)
            routes = capture.end(path, about)
        except BaseException:
            capture.abort()
            writer.discard()
            raise
        finally:
            if forcing is not None:
                forcing.end()
        points = writer.close({**about, "fused": ",".join(capture.arch.fused), "prompt_len": str(request.prompt_len),
                               "logits_from": str(logits_from), "missing_map": capture.arch.missing, **after()})
        result = trace_result(engine_name, request, path, points, writer, started, routes)
        result.forced = source is not None
        yield result


def layer_inputs(model: Any, capture: Capture, num_layers: int) -> LayerInputs | None:
    """The layer-input hooks of a model whose map can force its layers (None where it cannot)."""
    return None if LayerInputs.possible(capture.arch) else LayerInputs(model, capture.arch, num_layers)
