"""Scaled rope in llama.cpp (F32 GGUFs written here with llama.cpp's rope keys and tensors) against HF, on the tiny
Llamas whose rope_parameters scale rope past an original context of 32 tokens: a 32-token prompt (the original
context) and a 44-token one, 16 greedy tokens each. Linear, llama3 (a rope_freqs tensor) and yarn match on both and
explain keeps them inside the noise floor. LongRoPE matches on the 44-token prompt (both engines take the long
factors) and parts at step 0 on the 32-token one: HF chooses its factors by the sequence's length (short ones while
it is no longer than 32), llama.cpp by the context it allocated (long ones once its per-sequence context exceeds 32),
and explain names rope as a difference that depends on the length. llama.cpp pads the context it allocates up to a
multiple of 256, so even `n_ctx: 32` allocates 256 and takes the long factors on a run that never passes 32 tokens.
One `parity explain` of the five scenarios."""

from __future__ import annotations

import json

import pytest

from helpers import ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

KINDS = ("linear", "llama3", "yarn", "longrope")
MATCHING = ("linear", "llama3", "yarn")
PROMPTS = {  # id -> text; 32 tokens: the original context, 44 past it, 13 inside it
    "long32": "The quick brown fox jumps over the lazy dog while the cat watches from the window sill, and the birds "
              "sing in the old oak tree by the river bank",
    "long44": "The quick brown fox jumps over the lazy dog while the cat watches from the window sill, and the birds "
              "sing in the old oak tree by the river bank, then the sun sets behind the hills and the night falls",
    "short13": "The quick brown fox jumps over the lazy dog while the cat watches",
}
SCENARIO = """\
name: llamacpp-rope-{name}
model: tiny-llama-rope-{kind}
engines:
  hf: {{engine: hf, reference: true}}
  llama.cpp: {{engine: llama.cpp, options: {options}, expect: {{tokens: any}}}}
prompts:
{prompts}
params: {{temperature: 0, max_new_tokens: 16, ignore_eos: true}}
"""


def scenario(name: str, kind: str, prompts: tuple[str, ...], options: str = "{gguf: f32}") -> str:
    listed = "\n".join(f'  - {{id: {p}, text: "{PROMPTS[p]}"}}' for p in prompts)
    return SCENARIO.format(name=name, kind=kind, options=options, prompts=listed)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, ParityRun]:
    """`parity explain` of a scenario per rope type, and of LongRoPE with `n_ctx: 32` on a run inside 32 tokens."""
    tmp = tmp_path_factory.mktemp("llamacpp-rope")
    texts = {kind: scenario(kind, kind, ("long32", "long44")) for kind in KINDS}
    texts["longrope-nctx"] = scenario("longrope-nctx", "longrope", ("short13",), "{gguf: f32, n_ctx: 32}")
    files = [str(write_scenario(tmp / f"{name}.yaml", text)) for name, text in texts.items()]
    run = parity("explain", *files, out=tmp / "out")
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return {d.name.split("-llamacpp-rope-", 1)[1]: ParityRun(run.code, run.stdout, run.stderr, d)
            for d in sorted((tmp / "out").iterdir())}


def verdicts(run: ParityRun) -> dict[str, dict]:
    return run.verdicts.set_index("case_id").to_dict("index")


def localisation(run: ParityRun) -> dict:
    found = json.loads((run.run_dir / "explain" / "localisation.json").read_text())["localisations"]
    return next(loc for loc in found if loc["engine"] == "llama.cpp")


@pytest.mark.parametrize("kind", MATCHING)
def test_llama_cpp_matches_hf_past_the_original_context(runs: dict[str, ParityRun], kind: str) -> None:
    for case, verdict in verdicts(runs[kind]).items():
        assert verdict["verdict"] == "match", (case, verdict["explanation"])
        assert verdict["max_abs_logprob_delta"] < 1e-3, case  # measured: at most 8.1e-5 (yarn, long44)
    located = localisation(runs[kind])
    assert located["cause"] == "none", located["verdict"]


def test_the_gguf_carries_llama_cpps_rope_scaling(runs: dict[str, ParityRun]) -> None:
    """The F32 files the runs read: rope.scaling keys for linear, yarn and longrope, and llama3's rope_freqs."""
    from gguf import GGUFReader

    from harness.models.catalog import gguf_metadata, models_root

    for kind in KINDS:
        assert runs[kind].meta["engines"]["llama.cpp"]["versions"]["gguf"] == "f32.gguf"
        file = models_root() / f"tiny-llama-rope-{kind}" / "gguf" / "f32.gguf"
        scaling = gguf_metadata(file, ("llama.rope.scaling.type",)).get("llama.rope.scaling.type")
        assert scaling == (None if kind == "llama3" else kind), kind
    for kind, extra in (("llama3", {"rope_freqs.weight"}), ("longrope", {"rope_factors_long.weight",
                                                                       "rope_factors_short.weight"})):
        names = {t.name for t in GGUFReader(models_root() / f"tiny-llama-rope-{kind}" / "gguf" / "f32.gguf").tensors}
        assert extra <= names and not {n for n in names if n.startswith("rope_")} - extra, kind


def test_longrope_parts_where_hf_takes_the_short_factors_and_explain_says_it_depends_on_the_length(
        runs: dict[str, ParityRun]) -> None:
    found = verdicts(runs["longrope"])
    assert found["long44"]["verdict"] == "match", found["long44"]["explanation"]  # both take the long factors
    assert found["long32"]["verdict"] == "diverged" and found["long32"]["first_divergence"] == 0
    located = localisation(runs["longrope"])
    assert located["cause"] == "length", located["verdict"]
    assert located["out_of_floor"]["point"] in ("layers.0.q_rope", "layers.0.k_rope"), located["verdict"]
    assert "longrope rope chooses its factors by the sequence's length" in located["verdict"]


def test_llama_cpp_pads_a_small_n_ctx_and_takes_the_long_factors_on_a_short_run(runs: dict[str, ParityRun]) -> None:
    run = runs["longrope-nctx"]
    assert run.meta["engines"]["llama.cpp"]["versions"]["n_ctx"] == \
        "256 allocated, 256 per sequence, 32 asked (n_ctx option)"
    verdict = verdicts(run)["short13"]  # 29 tokens in all: HF's short factors throughout, llama.cpp's long ones
    assert verdict["verdict"] == "diverged" and verdict["first_divergence"] == 0, verdict["explanation"]
