"""The llama.cpp engines' pure logic: GGUF naming and rope layout, the graph-tensor map, the echo alignment of
llama-cpp-python's server, the dialect's schema check, '' as EOS, and the translation's warnings (no engine loads)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from adapters.engines.gguf_architectures import hparams, writer_for
from adapters.engines.gguf_rope import rope_layout
from adapters.engines.gguf_writer import gguf_name
from adapters.engines.llamacpp import translate
from adapters.engines.llamacpp_server import echo_positions
from adapters.http.client import translate as request_body
from adapters.http.dialect_check import schema_problems
from adapters.http.dialects import DIALECTS
from adapters.http.token_ids import TokenResolver, TokenTable
from adapters.tracing.ggml_graph import GGML_LLAMA, GGML_QWEN2, hf_layout
from harness.core.vocabulary import SamplingParams


def test_rope_layout_pairs_the_two_halves_of_each_head() -> None:
    """One head of width 4: HF's rows (0, 2) and (1, 3) are rotated together; llama.cpp's adjacent rows are."""
    weight = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)  # 2 heads x head_dim 4, 3 inputs
    permuted = rope_layout(weight, n_head=2)
    assert [int(r) for r in permuted[:, 0] // 3] == [0, 2, 1, 3, 4, 6, 5, 7]


def test_hf_layout_undoes_the_permutation_on_activations() -> None:
    rng = np.random.default_rng(0)
    weight, x = rng.normal(size=(3 * 8, 5)), rng.normal(size=(7, 5))  # 3 heads x head_dim 8; 7 positions
    llama_cpp_q = x @ rope_layout(weight, n_head=3).T
    assert np.allclose(hf_layout(llama_cpp_q, n_head=3), x @ weight.T)


def test_hf_tensor_names_map_to_llama_cpp_names() -> None:
    assert gguf_name("model.layers.3.self_attn.q_proj.weight", 30) == "blk.3.attn_q.weight"
    assert gguf_name("model.layers.29.mlp.down_proj.weight", 30) == "blk.29.ffn_down.weight"
    assert gguf_name("model.layers.0.post_attention_layernorm.weight", 30) == "blk.0.ffn_norm.weight"
    assert gguf_name("model.embed_tokens.weight", 30) == "token_embd.weight"
    assert gguf_name("model.norm.weight", 30) == "output_norm.weight"


def test_hyperparameters_read_rope_theta_where_transformers_5_writes_it() -> None:
    config = {"model_type": "llama", "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576,
              "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152, "rms_norm_eps": 1e-5,
              "head_dim": 64, "rope_parameters": {"rope_theta": 100000.0}}
    h = hparams(config)
    assert h["rope_freq_base"] == 100000.0 and h["head_count_kv"] == 3 and h["rope_dimension_count"] == 64
    assert hparams({**config, "rope_parameters": None, "rope_theta": 500.0})["rope_freq_base"] == 500.0


@pytest.mark.parametrize("name, op, point", [
    ("embd", "GET_ROWS", "embeddings"), ("attn_norm-0", "MUL", "layers.0.input_norm"),
    ("Qcur-3", "MUL_MAT", "layers.3.q"), ("Qcur-3", "RESHAPE", None), ("Qcur-3", "ROPE", "layers.3.q_rope"),
    ("Kcur-12", "ROPE", "layers.12.k_rope"), ("Vcur-1", "MUL_MAT", "layers.1.v"), ("Vcur-1", "RESHAPE", None),
    ("kqv_out-2", "CONT", "layers.2.attn"), ("attn_out-2", "MUL_MAT", "layers.2.o_proj"),
    ("ffn_norm-4", "MUL", "layers.4.post_norm"), ("ffn_gate-4", "MUL_MAT", "layers.4.gate"),
    ("ffn_out-4", "MUL_MAT", "layers.4.mlp"), ("l_out-29", "ADD", "layers.29.residual"),
    ("result_norm", "MUL", "final_norm"), ("kq-0", "MUL_MAT", None), ("cache_k_l0 (view)", "VIEW", None),
    ("norm-0", "RMS_NORM", None),
])
def test_llama_cpp_graph_tensors_map_to_capture_points(name: str, op: str, point: str | None) -> None:
    """Names and ops as llama.cpp's Llama graph computes them (observed through cb_eval, 0.3.36)."""
    assert GGML_LLAMA.point(name, op) == point


def test_echo_entries_are_realigned_by_position() -> None:
    """llama-cpp-python strips a leading BOS and skips every other BOS; entry i holds the logits of row i."""
    bos = 1
    assert echo_positions([1, 10, 11, 1, 12], bos) == [(0, True), (1, True), (3, True)]
    assert echo_positions([10, 11, 12], bos) == [(0, False), (1, False), (2, False)]


def test_dialect_is_checked_against_the_servers_request_schema() -> None:
    dialect = DIALECTS["llama-cpp-python"]
    defaults = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1, "max_tokens": 16}
    schema = {"properties": {**{field: {"default": value} for field, value in defaults.items()}, "min_tokens": {},
                             "frequency_penalty": {}, "presence_penalty": {}, "seed": {}, "stop": {},
                             "logit_bias": {}}}
    assert schema_problems(dialect, schema) == ([], [])
    older = {"properties": {**schema["properties"], "repeat_penalty": {"default": 1.0}}}
    older["properties"].pop("min_tokens")
    missing, differ = schema_problems(dialect, older)
    assert missing == ["min_new_tokens (sent as min_tokens)"]
    assert differ == ["the llama-cpp-python dialect documents repetition_penalty (field repeat_penalty) defaulting "
                      "to 1.1, the live server's request schema to 1.0"]
    with_ignore_eos = replace(dialect, extra_fields={**dialect.extra_fields, "ignore_eos": "ignore_eos"})
    assert schema_problems(with_ignore_eos, schema)[0] == ["ignore_eos (sent as ignore_eos)"]


def test_greedy_requests_neutralise_llama_cpp_python_servers_repeat_penalty() -> None:
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    python_server = request_body(greedy, DIALECTS["llama-cpp-python"], 5, "completions").native_params
    assert python_server["repeat_penalty"] == 1.0 and "top_k" not in python_server
    assert "repeat_penalty" not in request_body(greedy, DIALECTS["llamacpp"], 5, "completions").native_params


def test_empty_token_text_is_taken_as_eos_only_where_the_dialect_says_so() -> None:
    table = TokenTable(lambda: pytest.fail("'' must not reach the tokenizer"))
    resolver = TokenResolver(table, empty_token_id=2)
    assert resolver.resolve("") == 2
    assert any("token text '' taken as the EOS (id 2)" in w for w in resolver.warnings())


def test_translation_warns_where_llama_cpps_sampler_means_something_else() -> None:
    greedy = translate(SamplingParams(temperature=0, repetition_penalty=1.2, min_new_tokens=2, max_new_tokens=8))
    assert greedy.native_params["temp"] == 0.0 and greedy.native_params["repeat_penalty"] == 1.2
    assert greedy.native_params["top_k"] == 0 and greedy.native_params["penalty_last_n"] == 64
    assert any("counts the last 64 generated tokens, never the prompt" in w for w in greedy.warnings)
    assert any("min_new_tokens=2 NOT APPLIED" in w for w in greedy.warnings)
    sampled = translate(SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=8), last_n_tokens=32)
    assert sampled.native_params["top_p"] == 0.9 and sampled.native_params["min_p"] == 0.0
    assert any("llama.cpp truncates before dividing by the temperature" in w for w in sampled.warnings)


@pytest.mark.parametrize("name, op, point", [
    ("Qcur-0", "MUL_MAT", None), ("Qcur-0", "ADD", "layers.0.q"), ("Qcur-0", "ROPE", "layers.0.q_rope"),
    ("Kcur-1", "MUL_MAT", None), ("Kcur-1", "ADD", "layers.1.k"), ("Vcur-1", "ADD", "layers.1.v"),
    ("Vcur-1", "MUL_MAT", None), ("ffn_out-1", "MUL_MAT", "layers.1.mlp"),
])
def test_qwen2_graph_takes_q_k_v_after_their_biases(name: str, op: str, point: str | None) -> None:
    """Qwen 2's graph names the projection and its bias add alike (observed through cb_eval, 0.3.36)."""
    assert GGML_QWEN2.point(name, op) == point and not GGML_QWEN2.head_layout
    assert GGML_QWEN2.point("unnamed", "MUL_MAT", ("kqv_out-1",)) == "layers.1.o_proj"  # the output projection


def test_gguf_writers_follow_llama_cpps_converter_per_model_type() -> None:
    qwen2 = writer_for({"model_type": "qwen2"})
    assert qwen2.gguf_arch == "QWEN2" and not qwen2.transforms  # NEOX rope: nothing permuted
    assert writer_for({"model_type": "mistral"}) == writer_for({"model_type": "llama"})  # a Llama, window and all
    assert gguf_name("model.layers.1.self_attn.k_proj.bias", 2, "QWEN2") == "blk.1.attn_k.bias"
    with pytest.raises(RuntimeError, match="no GGUF writer for model type 'gpt2'"):
        writer_for({"model_type": "gpt2"})
