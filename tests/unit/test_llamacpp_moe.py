"""llama.cpp's mixture-of-experts families without loading an engine: the GGUF writers (experts stacked as llama.cpp
holds them, from per-expert checkpoints or transformers 5's fused stacks; hyperparameters; configs its graphs would
not reproduce refused in one line), the graph maps' names (observed through cb_eval, llama-cpp-python 0.3.36) and the
margin of a choice read from the router logits."""

from __future__ import annotations

import numpy as np
import pytest

from adapters.engines.gguf_architectures import stacked_experts, stored, writer_for
from adapters.engines.gguf_writer import gguf_name
from adapters.tracing.ggml_graph import GGML_LLAMA, GGML_QWEN2, GGML_QWEN3_MOE
from adapters.tracing.routes import choice_margin

MIXTRAL = {"model_type": "mixtral", "num_attention_heads": 2, "num_key_value_heads": 1, "hidden_size": 64,
           "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 49152, "rms_norm_eps": 1e-5,
           "head_dim": 32, "rope_parameters": {"rope_theta": 1e6}, "num_local_experts": 4, "num_experts_per_tok": 2,
           "sliding_window": None}
QWEN3_MOE = {**MIXTRAL, "model_type": "qwen3_moe", "moe_intermediate_size": 64, "norm_topk_prob": True,
             "decoder_sparse_step": 1, "mlp_only_layers": [], "use_sliding_window": False}


def _experts(rng: np.random.Generator, n: int = 3, ffn: int = 4, hidden: int = 5) -> dict[str, np.ndarray]:
    block = "model.layers.1.block_sparse_moe.experts"
    return {f"{block}.{e}.{w}.weight": rng.standard_normal((hidden, ffn) if w == "w2" else (ffn, hidden))
            for e in range(n) for w in ("w1", "w2", "w3")}


def test_per_expert_weights_are_stacked_in_expert_order_under_ggufs_names() -> None:
    rng = np.random.default_rng(0)
    tensors = {**_experts(rng), "model.norm.weight": np.ones(5)}
    out = stacked_experts(tensors)
    block = "model.layers.1.block_sparse_moe.experts"
    assert set(out) == {f"{block}.w1.weight", f"{block}.w2.weight", f"{block}.w3.weight", "model.norm.weight"}
    assert out[f"{block}.w1.weight"].shape == (3, 4, 5) and out[f"{block}.w2.weight"].shape == (3, 5, 4)
    assert np.array_equal(out[f"{block}.w1.weight"][2], tensors[f"{block}.2.w1.weight"])
    names = {gguf_name(name, 2, "LLAMA") for name in out}
    assert names == {"blk.1.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight",
                     "output_norm.weight"}
    assert gguf_name("model.layers.1.block_sparse_moe.gate.weight", 2, "LLAMA") == "blk.1.ffn_gate_inp.weight"


def test_a_fused_gate_up_stack_splits_into_the_same_tensors() -> None:
    rng = np.random.default_rng(1)
    gate, up, down = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5, 4))
    block = "model.layers.0.mlp.experts"
    out = stacked_experts({f"{block}.gate_up_proj": np.concatenate([gate, up], axis=1), f"{block}.down_proj": down})
    assert np.array_equal(out[f"{block}.gate_proj.weight"], gate) and np.array_equal(out[f"{block}.up_proj.weight"], up)
    assert np.array_equal(out[f"{block}.down_proj.weight"], down)
    assert {gguf_name(name, 1, "QWEN3MOE") for name in out} == {
        "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"}


def test_experts_missing_from_a_block_are_refused() -> None:
    tensors = {k: v for k, v in _experts(np.random.default_rng(2)).items() if ".1.w1" not in k}
    with pytest.raises(RuntimeError, match=r"experts of .*w1.weight are numbered \[0, 2\], not 0..1"):
        stacked_experts(tensors)


def test_moe_writers_follow_llama_cpps_converter() -> None:
    mixtral, qwen = writer_for(MIXTRAL), writer_for(QWEN3_MOE)
    assert mixtral.gguf_arch == "LLAMA" and [s for s, _ in mixtral.transforms] == ["attn_q.weight", "attn_k.weight"]
    assert qwen.gguf_arch == "QWEN3MOE" and not qwen.transforms  # NEOX rope: nothing permuted
    h = mixtral.hparams(MIXTRAL)
    assert (h["expert_count"], h["expert_used_count"], h["feed_forward_length"]) == (4, 2, 128)
    q = qwen.hparams(QWEN3_MOE)
    assert (q["expert_count"], q["expert_used_count"], q["expert_feed_forward_length"], q["key_length"]) == \
        (4, 2, 64, 32)
    router = np.ones((4, 64), dtype=np.float32)
    assert stored(router, "blk.0.ffn_gate_inp.weight", qwen, q, "f16").dtype == np.float32  # kept in f32
    assert stored(router, "blk.0.attn_q.weight", qwen, q, "f16").dtype == np.float16


@pytest.mark.parametrize("config, why", [
    ({**QWEN3_MOE, "norm_topk_prob": False}, "always renormalises the chosen experts' weights"),
    ({**QWEN3_MOE, "mlp_only_layers": [1]}, "a MoE block in every layer"),
    ({**QWEN3_MOE, "use_sliding_window": True}, "llama.cpp's qwen3moe graph has no sliding window"),
    ({**MIXTRAL, "num_local_experts": 0}, "no expert count"),
])
def test_configs_llama_cpps_moe_graphs_would_not_reproduce_are_refused_in_one_line(config: dict, why: str) -> None:
    writer = writer_for(config)
    with pytest.raises(RuntimeError) as error:
        writer.hparams(config)
    message = str(error.value)
    assert why in message and "\n" not in message and "give the engine a GGUF file" in message


@pytest.mark.parametrize("graph, name, op, point", [
    (GGML_LLAMA, "ffn_moe_logits-0", "MUL_MAT", "layers.0.router"),
    (GGML_LLAMA, "ffn_moe_out-1", "ADD", "layers.1.moe"),
    (GGML_LLAMA, "ffn_moe_probs-0", "SOFT_MAX", None), (GGML_LLAMA, "ffn_moe_weighted-0 (view)", "VIEW", None),
    (GGML_QWEN3_MOE, "Qcur-0", "MUL_MAT", "layers.0.q"), (GGML_QWEN3_MOE, "Qcur-0", "RESHAPE", None),
    (GGML_QWEN3_MOE, "Qcur_normed-0", "MUL", "layers.0.q_norm"), (GGML_QWEN3_MOE, "Kcur-1", "ROPE", "layers.1.k_rope"),
    (GGML_QWEN3_MOE, "Kcur_normed-1", "MUL", "layers.1.k_norm"), (GGML_QWEN3_MOE, "norm-0", "RMS_NORM", None),
    (GGML_QWEN3_MOE, "ffn_moe_logits-1", "MUL_MAT", "layers.1.router"),
    (GGML_QWEN3_MOE, "ffn_moe_out-0", "ADD", "layers.0.moe"), (GGML_QWEN3_MOE, "l_out-1", "ADD", "layers.1.residual"),
])
def test_moe_graph_tensors_map_to_capture_points(graph, name: str, op: str, point: str | None) -> None:
    assert graph.point(name, op) == point


def test_the_chosen_experts_and_their_weights_fill_the_routes_table() -> None:
    for graph in (GGML_LLAMA, GGML_QWEN3_MOE):
        assert graph.route("ffn_moe_topk-1") == "layers.1.experts"  # a VIEW of the argsort: read, never a point
        assert graph.route("ffn_moe_weights_norm-0") == "layers.0.expert_weights"
        assert graph.route("ffn_moe_weights_norm-0 (reshaped)") is None and graph.route("ffn_moe_weights-0") is None
    assert GGML_QWEN3_MOE.point("node_32", "MUL_MAT", ("kqv_out-0",)) == "layers.0.o_proj"  # unnamed in qwen3moe
    assert not GGML_QWEN2.routes and GGML_QWEN2.point("ffn_moe_out-0", "ADD") is None


def test_margin_is_the_weakest_chosen_logit_minus_the_strongest_unchosen() -> None:
    logits = np.array([[3.0, -3.0, 0.5, 0.51], [0.0, 1.0, 2.0, 3.0]])
    ids = np.array([[0, 3], [1, 0]])  # row 1: expert 0 chosen below unchosen 2 and 3 -> negative
    assert np.allclose(choice_margin(logits, ids), [[0.01], [-3.0]])
