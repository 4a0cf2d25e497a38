"""Scaled rope in the GGUF files written for llama.cpp (adapters.engines.gguf_rope): the keys and tensors each HF
rope type becomes (llama.cpp's converter's own: linear and yarn as rope.scaling keys, llama3 as a rope_freqs tensor,
LongRoPE as rope_factors_long / rope_factors_short with its attention factor), the one-line refusals of what llama.cpp
would compute differently, and the llama.cpp engines' context option (n_ctx) and YaRN betas. Every rope parameter is
the one the installed transformers computes with (issue 75 item 5): its default theta, its original context where
config.json states two, a per-layer-type config's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from adapters.engines.gguf_architectures import hparams, writer_for
from adapters.engines.gguf_rope import rope_scaling, rope_tensors
from adapters.engines.gguf_writer import gguf_file
from adapters.engines.llamacpp import context_size, yarn_betas
from harness.core.types import EngineSetup

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 100,
         "max_position_embeddings": 1024}
THETA = 10000.0
SHORT, LONG = [1.0 + 0.05 * i for i in range(16)], [1.0 + 0.5 * i for i in range(16)]


def scaled(kind: str, **extra: object) -> dict:
    """The small Llama with a rope of this kind, in the key transformers 5 writes (rope_parameters)."""
    return {**LLAMA, "rope_parameters": {"rope_type": kind, "rope_theta": THETA, **extra}}


LLAMA3 = scaled("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32)
LONGROPE = scaled("longrope", factor=32.0, short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=32)


def test_default_rope_writes_no_scaling() -> None:
    config = scaled("default")
    assert rope_scaling(config) == {} and rope_tensors(config) == {}
    assert hparams(config)["rope_freq_base"] == THETA


def test_linear_rope_is_llama_cpps_linear_scaling() -> None:
    config = scaled("linear", factor=4.0)
    assert rope_scaling(config) == {"rope_scaling_type": "linear", "rope_scaling_factor": 4.0}
    assert rope_tensors(config) == {}
    assert hparams(config)["rope_scaling_type"] == "linear"  # hparams carries the keys: every writer sharing it


def test_an_older_config_scales_through_rope_scaling_and_its_type_key() -> None:
    config = {**LLAMA, "rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert rope_scaling(config) == {"rope_scaling_type": "linear", "rope_scaling_factor": 2.0}
    assert hparams(config)["rope_freq_base"] == 500.0


def test_yarn_writes_type_factor_original_context_and_only_the_betas_the_config_sets() -> None:
    plain = scaled("yarn", factor=4.0, original_max_position_embeddings=32)
    assert rope_scaling(plain) == {"rope_scaling_type": "yarn", "rope_scaling_factor": 4.0,
                                   "rope_scaling_orig_ctx_len": 32}
    betas = scaled("yarn", factor=4.0, original_max_position_embeddings=32, beta_fast=16, beta_slow=2)
    assert rope_scaling(betas)["rope_scaling_yarn_beta_fast"] == 16.0
    assert rope_scaling(betas)["rope_scaling_yarn_beta_slow"] == 2.0
    with pytest.raises(RuntimeError, match="transformers cannot read its config .*'yarn': {'factor'}"):
        rope_scaling(scaled("yarn", original_max_position_embeddings=256))  # transformers 5.19 requires a factor


def test_llama3_becomes_a_rope_freqs_tensor_equal_to_transformers_scaling() -> None:
    """The factor each frequency is divided by, against transformers' own llama3 rope (default / llama3)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert rope_scaling(LLAMA3) == {}  # no rope.scaling keys: the tensor is the scaling
    factors = rope_tensors(LLAMA3)["rope_freqs.weight"]
    assert factors.dtype == np.float32 and factors.shape == (16,)
    config = LlamaConfig(**{k: v for k, v in LLAMA3.items() if k != "model_type"})
    default = 1.0 / THETA ** (np.arange(0, 32, 2, dtype=np.float32) / 32)  # unscaled rope's inverse frequencies
    llama3, _ = ROPE_INIT_FUNCTIONS["llama3"](config)
    np.testing.assert_allclose(factors, default / llama3.numpy(), rtol=1e-5)
    assert factors[0] == 1.0 and 1.0 < factors[1] < factors[2] < 8.0 and set(factors[3:]) == {8.0}  # kept, band, /8


def test_longrope_writes_both_factor_lists_its_original_context_and_attention_factor() -> None:
    h = rope_scaling(LONGROPE)
    assert h == {"rope_scaling_type": "longrope", "rope_scaling_orig_ctx_len": 32,
                 "rope_scaling_attn_factors": pytest.approx(math.sqrt(1 + math.log(32) / math.log(32)))}
    tensors = rope_tensors(LONGROPE)
    assert sorted(tensors) == ["rope_factors_long.weight", "rope_factors_short.weight"]
    np.testing.assert_array_equal(tensors["rope_factors_long.weight"], np.float32(LONG))
    np.testing.assert_array_equal(tensors["rope_factors_short.weight"], np.float32(SHORT))
    own = scaled("longrope", short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=32,
                 attention_factor=1.25)
    assert rope_scaling(own)["rope_scaling_attn_factors"] == 1.25


@pytest.mark.parametrize("config, why", [
    (scaled("dynamic", factor=2.0), "rope type 'dynamic' has no llama.cpp equivalent"),
    (scaled("yarn", factor=4.0, original_max_position_embeddings=32, attention_factor=1.5),
     "yarn with its own attention_factor"),
    (scaled("yarn", factor=4.0, original_max_position_embeddings=32, mscale=1.0, mscale_all_dim=1.0),
     "yarn with its own mscale, mscale_all_dim"),
    (scaled("yarn", factor=4.0, original_max_position_embeddings=32, truncate=False), "yarn with truncate: false"),
    ({**LLAMA, "model_type": "llama-ish"}, "model type 'llama-ish' is not one transformers knows"),
])
def test_a_rope_llama_cpp_would_compute_differently_is_refused_in_one_line(config: dict, why: str) -> None:
    with pytest.raises(RuntimeError) as error:
        hparams(config)
    message = str(error.value)
    assert f"cannot write model type '{config['model_type']}'" in message and why in message and "\n" not in message


def test_longrope_factor_lists_of_the_wrong_width_are_refused() -> None:
    config = scaled("longrope", short_factor=SHORT[:8], long_factor=LONG, original_max_position_embeddings=32)
    with pytest.raises(RuntimeError, match=r"must have 16 entries .*not 8 and 16"):
        rope_tensors(config)


@pytest.mark.parametrize("model_type, kind, graph", [("qwen2", "llama3", "qwen2"), ("qwen2", "longrope", "qwen2"),
                                                     ("qwen3_moe", "llama3", "qwen3moe")])
def test_factor_tensors_are_refused_where_llama_cpps_graph_would_not_read_them(model_type: str, kind: str,
                                                                               graph: str) -> None:
    config = {**(LLAMA3 if kind == "llama3" else LONGROPE), "model_type": model_type}
    with pytest.raises(RuntimeError) as error:
        writer_for(config)
    message = str(error.value)
    assert f"{kind} rope scaling is not written for llama.cpp's {graph} graph" in message and "\n" not in message


@pytest.mark.parametrize("model_type", ["llama", "mistral", "mixtral"])
def test_llama_written_types_take_every_rope_llama_cpp_reproduces(model_type: str) -> None:
    for config in (LLAMA3, LONGROPE, scaled("yarn", factor=4.0, original_max_position_embeddings=32)):
        assert writer_for({**config, "model_type": model_type}).gguf_arch == "LLAMA"
    assert writer_for({**scaled("yarn", factor=4.0, original_max_position_embeddings=32),
                       "model_type": "qwen2"}).gguf_arch == "QWEN2"  # yarn: scaling keys every graph applies


def hf_config(tmp_path: Path, config: dict):
    """The config transformers builds from this config.json, as from_pretrained reads a model folder."""
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps(config))
    return AutoConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize("inner", [32, None])
def test_llama3_factors_use_the_original_context_transformers_computes_with(tmp_path: Path, inner: int | None) -> None:
    """config.json states an original context at its top (64) and in rope_parameters (32), or only at its top: the
    model's rope function takes the top-level value either way (the writer took the rope dict's 32)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {k: v for k, v in LLAMA3["rope_parameters"].items() if k != "original_max_position_embeddings"}
    config = {**LLAMA3, "original_max_position_embeddings": 64,
              "rope_parameters": {**rope, **({"original_max_position_embeddings": inner} if inner else {})}}
    llama3, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config(tmp_path, config))
    default = 1.0 / THETA ** (np.arange(0, 32, 2, dtype=np.float32) / 32)
    np.testing.assert_allclose(rope_tensors(config)["rope_freqs.weight"], default / llama3.numpy(), rtol=1e-5)


@pytest.mark.parametrize("model_type, top, inner", [("llama", 64, 32), ("llama", None, None), ("phi3", None, 32)])
def test_longrope_attention_factor_uses_the_original_context_transformers_computes_with(
        tmp_path: Path, model_type: str, top: int | None, inner: int | None) -> None:
    """The attention factor, sqrt(1 + ln(factor) / ln(original context)), against transformers' own longrope function
    on the same config.json: the top-level value where there is one; else the rope dict's, else the class's own
    (Phi3Config's 4096, over the dict's 32) or max_position_embeddings (the writer refused a missing one)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from adapters.engines.gguf_rope import longrope_attention_factor, read_rope

    config = {**scaled("longrope", factor=32.0, short_factor=SHORT, long_factor=LONG,
                       **({"original_max_position_embeddings": inner} if inner else {})),
              "model_type": model_type, **({"original_max_position_embeddings": top} if top else {})}
    _, expected = ROPE_INIT_FUNCTIONS["longrope"](hf_config(tmp_path, config))
    assert longrope_attention_factor(config, read_rope(config)) == pytest.approx(expected, rel=1e-12)
    if model_type == "llama":
        assert rope_scaling(config)["rope_scaling_attn_factors"] == pytest.approx(expected, rel=1e-12)


def test_rope_theta_is_the_one_transformers_reads_per_layer_type_or_by_default(tmp_path: Path) -> None:
    """A per-layer-type config (qwen2 declares layer types) gives its theta inside each layer type's entry (the
    writer fell back to 10000); a config with no theta anywhere takes its class's default (Mixtral's 1e6)."""
    per_type = {**LLAMA, "model_type": "qwen2", "layer_types": ["full_attention", "full_attention"],
                "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6}}}
    expected = hf_config(tmp_path, per_type).rope_parameters["full_attention"]["rope_theta"]
    assert hparams(per_type)["rope_freq_base"] == expected == 1e6
    mixtral = {**LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
    assert hparams(mixtral)["rope_freq_base"] == hf_config(tmp_path, mixtral).rope_parameters["rope_theta"] == 1e6


def test_layer_types_with_ropes_of_their_own_are_refused_where_every_layer_rotates_alike() -> None:
    config = {**LLAMA, "model_type": "qwen2", "layer_types": ["sliding_attention", "full_attention"],
              "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    with pytest.raises(RuntimeError, match="sliding_attention layers have a rope of their own"):
        hparams(config)


def setup(max_context: int | None) -> EngineSetup:
    return EngineSetup(name="llama.cpp", model_path=Path("/nowhere"), dtype="float32", workdir=Path("/nowhere"),
                       max_context=max_context)


def test_n_ctx_defaults_to_the_runs_length_rounded_up_and_takes_the_option_that_fits() -> None:
    assert context_size(setup(48), None) == 512 and context_size(setup(600), None) == 768
    assert context_size(setup(None), None) == 512
    assert context_size(setup(48), 48) == 48 and context_size(setup(48), 4096) == 4096


def test_an_n_ctx_below_the_runs_longest_sequence_is_refused_in_one_line() -> None:
    with pytest.raises(RuntimeError) as error:
        context_size(setup(48), 32)
    message = str(error.value)
    assert message.startswith("n_ctx: 32 is below the 48 tokens") and "\n" not in message


def test_the_server_is_started_with_the_n_ctx_option_and_the_files_yarn_betas(tmp_path: Path) -> None:
    import gguf

    from adapters.engines.llamacpp_server import Options, command

    path = tmp_path / "yarn.gguf"
    with gguf_file(path, "LLAMA") as writer:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_yarn_beta_slow(4.0)
    assert yarn_betas(str(path)) == {"yarn_beta_slow": 4.0}
    assert yarn_betas(str(tmp_path / "missing.gguf")) == {}
    line = command(setup(48), 8000, Options(n_ctx=64), str(path), 1, False, context_size(setup(48), 64))
    assert line[line.index("--n_ctx") + 1] == "64" and line[line.index("--yarn_beta_slow") + 1] == "4.0"
    assert "--yarn_beta_fast" not in line
    default = command(setup(48), 8000, Options(), str(tmp_path / "missing.gguf"), 1, False,
                      context_size(setup(48), None))
    assert default[default.index("--n_ctx") + 1] == "512"
