"""Per-layer traces of llama.cpp through its graph evaluation callback (cb_eval in the context params).

llama.cpp names the tensors of its compute graph (src/models/<arch>.cpp: `cb(cur, "attn_norm", il)` names a layer's
tensor `attn_norm-<il>`). The scheduler asks the callback, node by node, whether it wants a tensor (ask=true), and
hands over each wanted one once computed (ask=false). A graph map says which named tensor, computed by which op, is
which canonical capture point (harness.core.points); the same name can label several nodes (Qcur-0 is the
projection, then its reshape, then its rope), so the op tells them apart and views are never taken.

llama.cpp's GGUF converter permutes the q and k projections of a Llama so that its rope rotates adjacent pairs;
q, k and their roped versions are put back in HF's head layout (hf_layout below, the inverse of
adapters.engines.gguf_rope.rope_layout), so the trace compares with HF's position by position (Gemma's rope is
NEOX, HF's layout: nothing to undo). An architecture without a map is refused with the reason.

A mixture-of-experts graph (llama.cpp's build_moe_ffn) names the router logits `ffn_moe_logits-<il>`, the block's
output `ffn_moe_out-<il>`, and the experts it chose and the weights it applies `ffn_moe_topk-<il>` (a view of its
argsort, int32) and `ffn_moe_weights_norm-<il>`: a full pass reads those two into the routes table beside the trace
(adapters.tracing.routes' layout), with the margin of each choice read from the router logits.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from adapters.tracing.capture import logits_start, trace_path, trace_result, trace_writer
from adapters.tracing.routes import ROUTER, Choice, write_table
from harness.core.points import layer_point, parse
from harness.core.types import TraceRequest, TraceResult
from harness.rundir.traces import Trace

VIEW_OPS = frozenset({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE"})  # no computation: never a capture point
GGML_F32, GGML_F16, GGML_I32 = 0, 1, 26
NUMPY_TYPES = {GGML_F32: np.float32, GGML_F16: np.float16, GGML_I32: np.int32}  # the ggml types read here


def hf_layout(activations: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp -> HF for q/k activations [positions, n_head*d] (the inverse of
    adapters.engines.gguf_rope.rope_layout on the last axis)."""
    positions, width = activations.shape
    head_dim = width // n_head
    return activations.reshape(positions, n_head, head_dim // 2, 2).swapaxes(2, 3).reshape(positions, width)


@dataclass(frozen=True)
class GraphMap:
    """Per-layer tensor names (llama.cpp's `name-<layer>`) and whole-model ones -> canonical points. A name maps to
    one point per op: {"Qcur": {"ROPE": "q_rope", "": "q"}} ("" is any op that is not a view). A graph that leaves
    a point's tensor unnamed names it by its input: by_input {"kqv_out": {"MUL_MAT": "o_proj"}} is the MUL_MAT
    computed from kqv_out-<layer>."""

    name: str
    per_layer: dict[str, dict[str, str]]
    whole: dict[str, str]
    head_layout: dict[str, str]  # point -> "q" or "kv": permuted by llama.cpp's converter, restored per head
    by_input: dict[str, dict[str, str]] = field(default_factory=dict)
    # a mixture of experts: per-layer tensor name -> routes table column ("experts", "expert_weights"), any op
    routes: dict[str, str] = field(default_factory=dict)

    def point(self, tensor_name: str, op: str, inputs: tuple[str, ...] = ()) -> str | None:
        """The point a graph node is (inputs: the names of its source tensors, needed only for by_input)."""
        if op in VIEW_OPS:
            return None
        if tensor_name in self.whole:
            return self.whole[tensor_name]
        return _per_layer(self.per_layer, tensor_name, op) or next(
            filter(None, (_per_layer(self.by_input, source, op) for source in inputs)), None)

    def route(self, tensor_name: str) -> str | None:
        """The routes table column a graph node fills (`layers.<i>.experts`), or None."""
        base, _, layer = tensor_name.rpartition("-")
        column = self.routes.get(base)
        return layer_point(int(layer), column) if column and layer.isdigit() else None


def _per_layer(table: dict[str, dict[str, str]], tensor_name: str, op: str) -> str | None:
    base, _, layer = tensor_name.rpartition("-")
    by_op = table.get(base)
    if by_op is None or not layer.isdigit():
        return None
    point = by_op.get(op, by_op.get(""))
    return layer_point(int(layer), point) if point else None


# llama.cpp's build_moe_ffn (softmax routing, the chosen weights renormalised): the router logits, the block's output,
# and the chosen experts (ffn_moe_topk: a view of the argsort of the router's probabilities) with the weights applied
MOE_POINTS = {"ffn_moe_logits": {"": "router"}, "ffn_moe_out": {"": "moe"}}
MOE_ROUTES = {"ffn_moe_topk": "experts", "ffn_moe_weights_norm": "expert_weights"}

# src/models/llama.cpp (llama-cpp-python 0.3.36's vendored llama.cpp); logits are read from the context, not here
LLAMA_DENSE = {"attn_norm": {"": "input_norm"}, "Qcur": {"ROPE": "q_rope", "": "q"},
               "Kcur": {"ROPE": "k_rope", "": "k"}, "Vcur": {"": "v"}, "kqv_out": {"": "attn"},
               "attn_out": {"": "o_proj"}, "ffn_norm": {"": "post_norm"}, "ffn_gate": {"": "gate"},
               "ffn_up": {"": "up"}, "ffn_out": {"": "mlp"}, "l_out": {"": "residual"}}
# a Llama GGUF with experts (Mixtral, as llama.cpp's converter writes it) has a MoE block where the MLP was
GGML_LLAMA = GraphMap(
    "ggml-llama", per_layer={**LLAMA_DENSE, **MOE_POINTS},
    whole={"embd": "embeddings", "inp_embd": "embeddings", "result_norm": "final_norm"},
    head_layout={"q": "q", "q_rope": "q", "k": "kv", "k_rope": "kv"}, routes=MOE_ROUTES,
)

# src/models/gemma3.cpp: q/k norms before rope, sandwich norms around attention and MLP (GELU-tanh gate), embeddings
# scaled by sqrt(hidden) ("inp_scaled"; "embd" is the unscaled lookup, not HF's embeddings point)
GGML_GEMMA3 = GraphMap(
    "ggml-gemma3",
    per_layer={"attn_norm": {"": "input_norm"}, "Qcur": {"ROPE": "q_rope", "": "q"},
               "Kcur": {"ROPE": "k_rope", "": "k"}, "Vcur": {"": "v"}, "Qcur_normed": {"": "q_norm"},
               "Kcur_normed": {"": "k_norm"}, "kqv_out": {"": "attn"},
               "attn_post_norm": {"": "attn_post_norm"}, "ffn_norm": {"": "post_norm"}, "ffn_gate": {"": "gate"},
               "ffn_up": {"": "up"}, "ffn_out": {"": "mlp"}, "ffn_post_norm": {"": "ffn_post_norm"},
               "l_out": {"": "residual"}},
    whole={"inp_scaled": "embeddings", "result_norm": "final_norm"},
    head_layout={},
    by_input={"kqv_out": {"MUL_MAT": "o_proj"}},  # gemma3.cpp leaves the output projection unnamed
)
# src/models/qwen2.cpp: Llama's names, but Qcur, Kcur and Vcur name both the projection (MUL_MAT) and the bias added
# to it (ADD): q, k and v are the ADD; the output projection is unnamed; NEOX rope, so q and k are in HF's layout
GGML_QWEN2 = replace(GGML_LLAMA, name="ggml-qwen2", head_layout={}, routes={}, per_layer={
    **LLAMA_DENSE, "Qcur": {"ROPE": "q_rope", "ADD": "q"}, "Kcur": {"ROPE": "k_rope", "ADD": "k"},
    "Vcur": {"ADD": "v"}}, by_input={"kqv_out": {"MUL_MAT": "o_proj"}})
# src/models/qwen3moe.cpp: per-head q/k norms (Qcur_normed, Kcur_normed) before a NEOX rope (HF's layout); Qcur and
# Kcur name the projection (MUL_MAT) and its rope; the output projection is unnamed
GGML_QWEN3_MOE = GraphMap(
    "ggml-qwen3moe",
    per_layer={**LLAMA_DENSE, "Qcur": {"ROPE": "q_rope", "MUL_MAT": "q"},
               "Kcur": {"ROPE": "k_rope", "MUL_MAT": "k"}, "Qcur_normed": {"": "q_norm"},
               "Kcur_normed": {"": "k_norm"}, **MOE_POINTS},
    whole=GGML_LLAMA.whole, head_layout={}, by_input={"kqv_out": {"MUL_MAT": "o_proj"}}, routes=MOE_ROUTES)
# general.architecture of the GGUF -> its graph map
GRAPH_MAPS = {"llama": GGML_LLAMA, "gemma3": GGML_GEMMA3, "qwen2": GGML_QWEN2, "qwen3moe": GGML_QWEN3_MOE}


class _Tensor(ctypes.Structure):
    """struct ggml_tensor (ggml/include/ggml.h; GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10,
    GGML_MAX_NAME 64). Checked against ggml's own accessors on every tensor read."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def _ggml() -> Any:
    import llama_cpp._ggml as ggml

    lib = ggml.libggml
    for name, restype, argtypes in (
            ("ggml_get_name", ctypes.c_char_p, [ctypes.c_void_p]), ("ggml_op_desc", ctypes.c_char_p, [ctypes.c_void_p]),
            ("ggml_nelements", ctypes.c_int64, [ctypes.c_void_p]), ("ggml_nbytes", ctypes.c_size_t, [ctypes.c_void_p]),
            ("ggml_backend_tensor_get", None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]),
            ("ggml_backend_tensor_set", None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t])):
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


def architecture(llama_cpp: Any, model: Any) -> str:
    """general.architecture of the loaded GGUF."""
    buffer = ctypes.create_string_buffer(64)
    llama_cpp.llama_model_meta_val_str(model, b"general.architecture", buffer, len(buffer))
    return buffer.value.decode()


class GraphTracer:
    """A second llama.cpp context on the engine's loaded model with the evaluation callback installed. One call
    evaluates a whole sequence (one batch, logits at every position) and streams the captured points to a
    trace writer (adapters.tracing.capture.trace_writer) in the order llama.cpp computes them; a full pass of a
    mixture-of-experts graph also collects the chosen experts (write_routes puts them beside the trace)."""

    def __init__(self, llama_cpp: Any, model: Any, context_params: Any, adapter: Any = None):
        """adapter: the engine's loaded LoRA adapter, set on the traced context too (llama.cpp applies one per
        context)."""
        self.llama_cpp, self.model = llama_cpp, model
        arch = architecture(llama_cpp, model)
        self.map = GRAPH_MAPS.get(arch)
        self.unavailable = "" if self.map else (
            f"llama.cpp trace: no graph map for architecture '{arch}' (known: {', '.join(GRAPH_MAPS)}): its tensor "
            "names are not mapped to capture points")
        self.heads = {"q": llama_cpp.llama_model_n_head(model), "kv": llama_cpp.llama_model_n_head_kv(model)}
        self.ggml = _ggml()
        self.wanted: set[str] | None = None
        self.writer: Any = None
        self.done: set[str] = set()
        self.positions = 0
        self.error = ""
        self.routing = False  # this pass collects the chosen experts (a full pass, a map with routes)
        self.inputs: Trace | None = None  # a layer-forced pass: the reference's trace whose rows each layer starts from
        self.routes: dict[str, np.ndarray] = {}  # routes table column (layers.<i>.experts) -> [positions, k]
        self.routers: dict[str, np.ndarray] = {}  # layers.<i>.router -> the router logits, for the margin
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_tensor)  # kept alive with the tracer
        context_params.cb_eval = self.callback
        context_params.cb_eval_user_data = None
        self.ctx = llama_cpp.llama_init_from_model(model, context_params)
        if not self.ctx:
            raise RuntimeError("llama.cpp trace: could not create the traced context")
        if adapter is not None and llama_cpp.llama_set_adapters_lora(
                self.ctx, (llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter), 1, (ctypes.c_float * 1)(1.0)):
            raise RuntimeError("llama.cpp trace: could not set the LoRA adapter on the traced context")

    def _point(self, tensor: int, name: str, op: str) -> str | None:
        if self.map is None:
            return None
        point = self.map.point(name, op, self._inputs(tensor, name) if self.map.by_input else ())
        if point is None or point in self.done:
            return None
        if self.wanted is not None and point not in self.wanted and not self._fed(point):
            return None
        return point

    def _fed(self, point: str) -> bool:
        """Whether this pass replaces a point's rows with the reference's: a layer's input (the embeddings, the
        residual stream after a layer) in a layer-forced pass."""
        return self.inputs is not None and (point == "embeddings" or point.endswith(".residual"))

    def _route(self, name: str) -> str | None:
        """The routes table column a node fills in this pass (each one once), or None."""
        column = self.map.route(name) if self.routing and self.map else None
        return column if column not in self.routes else None

    def _inputs(self, tensor: int, name: str) -> tuple[str, ...]:
        """The names of a node's source tensors (read through the struct, once its own name confirms the layout)."""
        struct = _Tensor.from_address(tensor)
        if struct.name.decode() != name:
            raise RuntimeError("the ggml_tensor layout of this llama.cpp build is not the one this reader knows")
        return tuple(self.ggml.ggml_get_name(source).decode() for source in struct.src if source)

    def _on_tensor(self, tensor: int, ask: bool, _user_data: Any) -> bool:
        try:
            name, op = self.ggml.ggml_get_name(tensor).decode(), self.ggml.ggml_op_desc(tensor).decode()
            point, column = self._point(tensor, name, op), self._route(name)
            if ask or (point is None and column is None):
                return point is not None or column is not None
            if point is not None:
                self._capture(tensor, point)
            if column is not None:
                self.routes[column] = self._values(tensor, column).reshape(self.positions, -1)
        except Exception as exc:  # an exception must not cross the C callback: abort the evaluation instead
            self.error = f"{type(exc).__name__}: {exc}"
            return False
        return True

    def _capture(self, tensor: int, point: str) -> None:
        self.done.add(point)
        if self.wanted is None or point in self.wanted:
            rows = self._read(tensor, point)
            if self.routing and point.endswith(f".{ROUTER}"):
                self.routers[point] = rows.numpy().astype(np.float64)
            self.writer.add(point, rows)
        if self._fed(point):
            self._feed(tensor, point)

    def _feed(self, tensor: int, point: str) -> None:
        """Overwrite a computed layer input with the reference's rows, before the nodes after it read it (the
        scheduler evaluates the graph up to each node the callback asked for, then hands it over)."""
        struct = _Tensor.from_address(tensor)
        if struct.type != GGML_F32 or struct.view_src or int(struct.nb[1]) != int(struct.ne[0]) * 4:
            raise RuntimeError(f"{point}: not a contiguous float32 tensor, cannot be fed the reference's rows")
        if self.inputs is None:
            raise RuntimeError(f"{point}: fed outside a forced pass")
        rows = np.ascontiguousarray(self.inputs.rows(point, 0, self.positions), dtype=np.float32)
        if rows.size != int(self.ggml.ggml_nelements(tensor)):
            raise RuntimeError(f"{point}: {rows.shape} reference rows for a tensor of {struct.ne[0]} x {struct.ne[1]}")
        self.ggml.ggml_backend_tensor_set(tensor, rows.ctypes.data, 0, rows.nbytes)

    def _values(self, tensor: int, what: str) -> np.ndarray:
        """A computed tensor's values in its own type, ggml's outermost axis first ([ne3, ne2, ne1, ne0]); a view
        (the chosen experts are a view of an argsort) is read through its strides."""
        struct = _Tensor.from_address(tensor)
        n = int(self.ggml.ggml_nelements(tensor))
        if struct.name.decode() != self.ggml.ggml_get_name(tensor).decode() or int(np.prod(struct.ne)) != n:
            raise RuntimeError("the ggml_tensor layout of this llama.cpp build is not the one this reader knows")
        if struct.type not in NUMPY_TYPES:
            raise RuntimeError(f"{what}: a tensor of ggml type {struct.type} cannot be read")
        raw = np.empty(self.ggml.ggml_nbytes(tensor), dtype=np.uint8)  # a view's extent, strides included
        self.ggml.ggml_backend_tensor_get(tensor, raw.ctypes.data, 0, raw.nbytes)
        return np.ndarray(tuple(reversed(struct.ne)), NUMPY_TYPES[struct.type], raw, 0,
                          tuple(reversed(struct.nb))).copy()

    def _read(self, tensor: int, point: str) -> Any:
        import torch

        rows = self._values(tensor, point).astype(np.float32).reshape(self.positions, -1)  # tokens: outermost
        layout = self.map.head_layout.get(point.rsplit(".", 1)[-1]) if self.map else None  # a point needs a map
        if layout:
            rows = hf_layout(rows, self.heads[layout])
        return torch.from_numpy(np.ascontiguousarray(rows))

    def run(self, token_ids: list[int], points: list[str] | None, writer: Any, logits_from: int,
            inputs_from: str | None = None) -> None:
        """Evaluate the sequence, streaming the wanted points (every point when None) and the logits from position
        logits_from on to writer. Every position is evaluated with its logits: llama.cpp computes only the rows
        of positions that ask for logits in its last layer, and the last layer's points need them all.
        inputs_from: the reference's trace each layer starts from (a layer-forced pass: adapters.tracing.forcing)."""
        import torch

        if self.unavailable and (points is None or set(points) - {"logits"}):
            raise RuntimeError(self.unavailable)
        inputs_from = inputs_from if self.map else None  # no graph map: its layers run free (its logits compared)
        lc = self.llama_cpp
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        self.writer, self.done, self.positions, self.error = writer, set(), len(token_ids), ""
        self.inputs = Trace(inputs_from) if inputs_from else None
        self.wanted = set(points) if points is not None else None
        self.routing, self.routes, self.routers = bool(self.map and self.map.routes) and points is None, {}, {}
        batch = lc.llama_batch_init(len(token_ids), 0, 1)
        try:
            for i, token in enumerate(token_ids):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, 1
                batch.seq_id[i][0] = 0
            batch.n_tokens = len(token_ids)
            status = lc.llama_decode(self.ctx, batch)
        finally:
            lc.llama_batch_free(batch)
            self.writer, inputs, self.inputs = None, self.inputs, None
        if self.error or status != 0:
            raise RuntimeError(f"llama.cpp trace: {self.error or f'llama_decode returned {status}'}")
        if inputs is not None:
            fed = {"embeddings", *(p for p in inputs.points if p.endswith(".residual"))}
            if missing := sorted(fed - self.done):
                raise RuntimeError(f"llama.cpp trace: the graph computed no {missing[0]} to start a layer from")
        if points is None or "logits" in points:
            vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
            logits = np.ctypeslib.as_array(lc.llama_get_logits(self.ctx), shape=(len(token_ids) * vocab,))
            writer.add("logits", torch.from_numpy(logits.reshape(len(token_ids), vocab)[logits_from:].copy()))

    def write_routes(self, trace: Path, metadata: dict[str, str]) -> Path | None:
        """The last pass's chosen experts, their weights and the margin of each choice, written beside its trace
        (adapters.tracing.routes' table); None where the pass collected none (a dense model, a partial pass)."""
        layers = {}
        for layer in sorted({parse(column)[0] for column in self.routes}):
            ids, weights = (self.routes.get(layer_point(layer, c)) for c in ("experts", "expert_weights"))
            if ids is None or weights is None:
                raise RuntimeError(f"llama.cpp trace: layer {layer}: chosen experts and their weights were not "
                                   "both captured")
            layers[layer] = Choice(ids, weights, self.routers.get(layer_point(layer, ROUTER)))
        return write_table(trace, layers, "softmax", metadata)

    def close(self) -> None:
        if self.ctx:
            self.llama_cpp.llama_free(self.ctx)
            self.ctx = None


def run_graph_traces(engine_name: str, tracer: GraphTracer, requests: list[TraceRequest], workdir: Path,
                     metadata: dict[str, str]) -> Iterator[TraceResult]:
    """One teacher-forced evaluation per request, its points streamed to workdir/traces/<case>.safetensors (and
    a mixture of experts' chosen experts to <case>.routes.safetensors)."""
    import torch

    for request in requests:
        path = trace_path(workdir, request)
        writer = trace_writer(request, path, torch.float32)
        started = time.perf_counter()
        logits_from = logits_start(request)
        try:
            tracer.run(request.token_ids, request.points, writer, logits_from, request.inputs_from)
        except BaseException:
            writer.discard()
            raise
        about = {**metadata, "arch": tracer.map.name if tracer.map else "", "case_id": request.case_id,
                 "forced": str(request.inputs_from is not None and tracer.map is not None).lower()}
        points = writer.close({**about, "fused": "", "prompt_len": str(request.prompt_len),
                               "logits_from": str(logits_from)})
        routes = tracer.write_routes(path, about)
        result = trace_result(engine_name, request, path, points, writer, started, routes)
        result.forced = request.inputs_from is not None and tracer.map is not None
        yield result
