"""The KV cache options of the llama.cpp and vLLM engines, checked before anything loads: what llama.cpp cannot create
(a quantised V cache without flash attention), and a processor vLLM's fp8 cache does not run on."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize("options", [
    {"kv_cache": "q8_0"}, {"kv_cache_v": "q4_0"}, {"kv_cache": "f16", "kv_cache_v": "q8_0"}])
def test_a_quantised_v_cache_without_flash_attention_is_refused(options) -> None:
    """llama.cpp fails to create a context with a quantised V cache and no flash attention: refused at validation,
    on both llama.cpp engines, with the fix."""
    from pydantic import ValidationError

    from adapters.engines import llamacpp, llamacpp_server

    for engine in (llamacpp.Options, llamacpp_server.Options):
        with pytest.raises(ValidationError, match="quantises the V cache only with flash attention: set flash_attn"):
            engine(**options)
        assert engine(**options, flash_attn=True).cache_types()[1] in ("q8_0", "q4_0")


def test_k_and_v_caches_are_set_apart() -> None:
    from adapters.engines.llamacpp import Options

    assert Options(kv_cache_k="q8_0").cache_types() == ("q8_0", "f32")
    assert Options(kv_cache_k="q8_0").cache_words() == "K q8_0, V f32"
    assert Options(kv_cache="q4_0", flash_attn=True).cache_words() == "q4_0"


def test_an_fp8_vllm_cache_needs_avx512(monkeypatch) -> None:
    from adapters.engines.vllm_offline import fp8_cache_problem

    assert fp8_cache_problem("auto") is None
    monkeypatch.setattr(Path, "read_text", lambda self: "flags\t\t: fpu sse avx2 fma")
    problem = fp8_cache_problem("fp8_e4m3")
    assert problem is not None and problem.startswith("kv_cache_dtype fp8_e4m3: vLLM's CPU attention quantises the KV "
                                                       "cache with AVX-512 kernels, which this processor lacks")
    monkeypatch.setattr(Path, "read_text", lambda self: "flags\t\t: fpu avx2 avx512f avx512bw")
    assert fp8_cache_problem("fp8") is None


def test_a_vllm_cache_under_one_gib_is_asked_in_bytes() -> None:
    """vLLM reads VLLM_CPU_KVCACHE_SPACE as whole GiB and lets it override the bytes asked for: below 1 GiB it is left
    unset, and the server gets --kv-cache-memory-bytes."""
    from adapters.engines.vllm_offline import cache_space
    from adapters.engines.vllm_server import Options as ServerOptions
    from adapters.engines.vllm_server import command
    from harness.core.types import EngineSetup

    assert cache_space(2.0) == {"VLLM_CPU_KVCACHE_SPACE": "2"} and cache_space(0.25) == {}
    setup = EngineSetup(name="s", model_path=Path("/m"), dtype="float32", options={}, workdir=Path("/w"))
    cmd = command(setup, 8000, ServerOptions(kv_cache_gib=0.25))
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(2**28)
    assert "--kv-cache-memory-bytes" not in command(setup, 8000, ServerOptions())
