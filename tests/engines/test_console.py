"""A quiet console: `parity models prepare` on an empty cache (transformers reading SmolLM2's GGUF tokenizer and
writing shards, the GGUF variants written for llama.cpp, torch's compiler modules importing triton) prints only the
project's lines, one per model and engine. Every other `parity` subprocess of the suite is held to the same rule by
tests/helpers.py's parity()."""

from __future__ import annotations

import filecmp
from pathlib import Path

from harness.models import MODELS

from helpers import foreign_lines, parity


def test_models_prepare_on_an_empty_cache_prints_only_its_own_lines(tmp_path: Path) -> None:
    run = parity("models", "prepare", "tiny-llama", env={"LLM_PARITY_CACHE": str(tmp_path / "cache")})
    assert run.code == 0, run.stderr[-2000:]
    assert run.stderr == "" and foreign_lines(run.stdout) == []
    assert run.stdout.splitlines() == [
        f"tiny-llama: prepared at {tmp_path / 'cache' / 'models' / 'tiny-llama'}",
        f"  llama.cpp: GGUF variants f32, f16, q8_0, q4_k_m in {tmp_path / 'cache' / 'models' / 'tiny-llama' / 'gguf'}"]
    # built without SmolLM2 (its tokenizer read from the GGUF), it is the suite's tiny-llama, built with it
    built, suite = tmp_path / "cache" / "models" / "tiny-llama" / "float32", MODELS["tiny-llama"].folder("float32")
    assert not (tmp_path / "cache" / "models" / "smollm2-135m").exists()
    names = sorted(path.name for path in suite.iterdir())
    assert names == sorted(path.name for path in built.iterdir())
    assert filecmp.cmpfiles(built, suite, names, shallow=False)[0] == names


def test_a_bare_prepare_leaves_the_gguf_variants_for_first_use(tmp_path: Path) -> None:
    """`make quickstart` runs a bare `parity models prepare`: it builds no GGUF variant (llama.cpp builds the one it
    runs on first use) and says so. The models' folders are the suite's, linked, so nothing is converted here."""
    cache = tmp_path / "cache" / "models"
    for name, model in MODELS.items():
        if not model.on_demand:
            for dtype in ("float32", "bfloat16"):
                (cache / name).mkdir(parents=True, exist_ok=True)
                (cache / name / dtype).symlink_to(model.folder(dtype))
    run = parity("models", "prepare", env={"LLM_PARITY_CACHE": str(tmp_path / "cache")})
    assert run.code == 0, run.stderr[-2000:]
    assert "  llama.cpp: GGUF variants f32, f16, q8_0, q4_k_m built on first use (or now: `parity models prepare " \
           "--engine-files`)" in run.stdout.splitlines()
    assert not list(cache.rglob("*.gguf")), list(cache.rglob("*.gguf"))
