"""Gemma 3 in the llama.cpp engines' pure logic: `gguf: bundled` as the source GGUF of the folder's named model, the
GGUF writer's description of gemma3_text (hyperparameter keys as llama.cpp's converter writes them, tensor names,
norm weights stored as 1 + w, no rope permutation), the GGUF vocabulary spelled as HF spells it, and the cb_eval
graph map of llama.cpp's gemma3 graph (no engine loads)."""

from __future__ import annotations

import numpy as np
import pytest

from adapters.engines.gguf_architectures import WRITERS, gemma3_hparams, stored
from adapters.engines.gguf_cache import bundled_source, named_model
from adapters.engines.gguf_rope import rope_layout
from adapters.engines.gguf_tokenizer import hf_pieces
from adapters.engines.gguf_writer import gguf_name
from adapters.tracing.ggml_graph import GGML_GEMMA3
from harness.models.catalog import MODELS

LAYER_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 3
CONFIG = {  # gemma3-270m's config.json as transformers 5.19 writes it (the fields the writer reads)
    "model_type": "gemma3_text", "num_hidden_layers": 18, "hidden_size": 640, "intermediate_size": 2048,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "sliding_window": 512, "query_pre_attn_scalar": 256, "attn_logit_softcapping": None,
    "final_logit_softcapping": None, "layer_types": LAYER_TYPES, "vocab_size": 262144,
    "rope_parameters": {"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
}


def test_gguf_bundled_is_the_source_of_the_named_model_a_folder_belongs_to(tmp_path, monkeypatch) -> None:
    """Found from the folder's cache dir (a folder that links its weights, like smollm2-135m-genconfig, belongs to
    the model it links to); a model with no source GGUF has no bundled file."""
    monkeypatch.setenv("LLM_PARITY_CACHE", str(tmp_path))
    models = tmp_path / "models"
    assert named_model(models / "gemma3-270m" / "float32") is MODELS["gemma3-270m"]
    linked = models / "smollm2-135m-genconfig" / "float32"
    linked.mkdir(parents=True)
    (linked / "model.safetensors").symlink_to(models / "smollm2-135m" / "float32" / "model.safetensors")
    assert named_model(linked) is MODELS["smollm2-135m"]
    assert named_model(tmp_path / "elsewhere") is None
    with pytest.raises(RuntimeError, match="was not converted from a GGUF file"):
        bundled_source(models / "tiny-llama" / "float32")


def test_gemma3_hyperparameters_are_the_keys_llama_cpps_converter_writes() -> None:
    assert gemma3_hparams(CONFIG) == {
        "context_length": 32768, "embedding_length": 640, "block_count": 18, "feed_forward_length": 2048,
        "head_count": 4, "layer_norm_rms_eps": 1e-6, "key_length": 256, "value_length": 256,
        "rope_freq_base": 1e6, "sliding_window": 512, "head_count_kv": 1}


def test_gemma3_writes_what_differs_from_llama_cpps_defaults() -> None:
    """llama.cpp assumes 5 sliding layers then 1 full, and rope base 10000 on sliding layers, unless told."""
    other = {**CONFIG, "layer_types": ["sliding_attention", "full_attention"] * 9, "final_logit_softcapping": 30.0,
             "rope_parameters": {**CONFIG["rope_parameters"], "sliding_attention": {"rope_theta": 5e4}}}
    h = gemma3_hparams(other)
    assert h["sliding_window_pattern"] == [True, False] * 9
    assert h["rope_freq_base_swa"] == 5e4 and h["final_logit_softcapping"] == 30.0


@pytest.mark.parametrize("change, why", [
    ({"query_pre_attn_scalar": 128}, "not by query_pre_attn_scalar"),
    ({"attn_logit_softcapping": 50.0}, "no attention soft-capping"),
    ({"rope_parameters": {**CONFIG["rope_parameters"], "full_attention": {"rope_theta": 1e6, "rope_type": "linear",
                                                                                  "factor": 2.0}}},
     "rope scaling"),
])
def test_a_gemma3_config_llama_cpp_would_compute_differently_is_refused(change: dict, why: str) -> None:
    with pytest.raises(RuntimeError, match=f"cannot write model type 'gemma3_text': .*{why}"):
        gemma3_hparams({**CONFIG, **change})


@pytest.mark.parametrize("hf, name", [
    ("model.layers.2.self_attn.q_norm.weight", "blk.2.attn_q_norm.weight"),
    ("model.layers.2.self_attn.k_norm.weight", "blk.2.attn_k_norm.weight"),
    ("model.layers.2.post_attention_layernorm.weight", "blk.2.post_attention_norm.weight"),
    ("model.layers.2.pre_feedforward_layernorm.weight", "blk.2.ffn_norm.weight"),
    ("model.layers.2.post_feedforward_layernorm.weight", "blk.2.post_ffw_norm.weight"),
    ("model.layers.17.self_attn.o_proj.weight", "blk.17.attn_output.weight"),
    ("model.embed_tokens.weight", "token_embd.weight"),
])
def test_gemma3_tensor_names_are_llama_cpps(hf: str, name: str) -> None:
    assert gguf_name(hf, 18, WRITERS["gemma3_text"].gguf_arch) == name


def test_gemma_norms_are_stored_as_one_plus_w_and_nothing_is_permuted() -> None:
    gemma, llama = WRITERS["gemma3_text"], WRITERS["llama"]
    h = gemma3_hparams(CONFIG)
    norm = np.array([-0.5, 0.0, 2.0], dtype=np.float32)
    for name in ("blk.0.attn_norm.weight", "blk.0.attn_q_norm.weight", "blk.0.post_ffw_norm.weight",
                 "output_norm.weight"):
        assert np.array_equal(stored(norm, name, gemma, h, "f32"), [0.5, 1.0, 3.0]), name
    q = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    assert np.array_equal(stored(q, "blk.0.attn_q.weight", gemma, h, "f32"), q)  # NEOX rope: HF's layout
    assert np.array_equal(stored(q, "blk.0.attn_q.weight", llama, {"head_count": 2}, "f32"), rope_layout(q, 2))
    assert stored(q, "blk.0.attn_q.weight", gemma, h, "f16").dtype == np.float16
    assert stored(norm, "blk.0.attn_norm.weight", gemma, h, "f16").dtype == np.float32  # 1-D stays f32


def test_a_sentencepiece_gguf_vocabulary_is_compared_as_hf_spells_it() -> None:
    """Gemma's GGUF holds its runs-of-spaces tokens (user-defined) with spaces; HF with the \u2581 mark."""
    assert hf_pieces("llama", ["<bos>", "  ", "\u2581the"]) == ["<bos>", "\u2581\u2581", "\u2581the"]
    assert hf_pieces("gpt2", ["a b"]) == ["a b"]


@pytest.mark.parametrize("name, op, inputs, point", [
    ("embd", "GET_ROWS", (), None), ("inp_scaled", "SCALE", (), "embeddings"),
    ("attn_norm-0", "MUL", (), "layers.0.input_norm"), ("norm-0", "RMS_NORM", (), None),
    ("Qcur-0", "MUL_MAT", (), "layers.0.q"), ("Qcur-0", "RESHAPE", (), None),
    ("Qcur_normed-0", "MUL", (), "layers.0.q_norm"), ("Qcur-0", "ROPE", (), "layers.0.q_rope"),
    ("node_9", "SCALE", ("Qcur-0",), None), ("Kcur_normed-5", "MUL", (), "layers.5.k_norm"),
    ("Kcur-5", "ROPE", (), "layers.5.k_rope"), ("Vcur-5", "MUL_MAT", (), "layers.5.v"),
    ("kqv_out-3", "CONT", (), "layers.3.attn"),
    ("node_34", "MUL_MAT", ("blk.3.attn_output.weight", "kqv_out-3"), "layers.3.o_proj"),
    ("attn_post_norm-3", "MUL", (), "layers.3.attn_post_norm"), ("sa_out-3", "ADD", (), None),
    ("ffn_norm-3", "MUL", (), "layers.3.post_norm"), ("ffn_gate-3", "MUL_MAT", (), "layers.3.gate"),
    ("ffn_up-3", "MUL_MAT", (), "layers.3.up"), ("ffn_geglu-3", "GEGLU", (), None),
    ("ffn_out-3", "MUL_MAT", (), "layers.3.mlp"), ("ffn_post_norm-3", "MUL", (), "layers.3.ffn_post_norm"),
    ("l_out-17", "ADD", (), "layers.17.residual"), ("result_norm", "MUL", (), "final_norm"),
    ("node_800", "GET_ROWS", ("node_799", "out_ids"), None),
])
def test_llama_cpp_gemma3_graph_tensors_map_to_capture_points(name: str, op: str, inputs: tuple[str, ...],
                                                               point: str | None) -> None:
    """Names, ops and inputs as llama.cpp's gemma3 graph computes them (observed through cb_eval, 0.3.36): the
    output projection is left unnamed, so it is found as the MUL_MAT computed from kqv_out."""
    assert GGML_GEMMA3.point(name, op, inputs) == point
