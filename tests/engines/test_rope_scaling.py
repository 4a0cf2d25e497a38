"""Scaled rope (issue 59, item 4) in HF and vLLM's CPU build (llama.cpp on the shipped LongRoPE scenario too), on the
tiny Llamas whose rope the config's rope_parameters scales (original context 32 tokens, a 32-token prompt and 16 new
tokens: past the switch). Linear, llama3 and yarn match token for token and explain keeps them inside the noise
floor; LongRoPE parts at step 0, and explain, whose full teacher-forced pass agrees, traces the prefix the engines
had and names rope as a difference that depends on the sequence's length (scenarios/rope-scaling.yaml). One `parity
explain` of the four scenarios."""

from __future__ import annotations

import json

import pytest

from helpers import SCENARIOS, ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

MATCHING = ("linear", "llama3", "yarn")
PROMPT = ("The quick brown fox jumps over the lazy dog while the cat watches from the window sill, and the birds sing "
          "in the old oak tree by the river bank")  # 32 tokens: the original context
SCENARIO = """\
name: rope-{kind}
model: tiny-llama-rope-{kind}
engines:
  hf: {{engine: hf, reference: true}}
  vllm: {{engine: vllm}}
prompts:
  - {{id: long, text: "{prompt}"}}
params: {{temperature: 0, max_new_tokens: 16, ignore_eos: true}}
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, ParityRun]:
    tmp = tmp_path_factory.mktemp("rope")
    files = [str(write_scenario(tmp / f"{kind}.yaml", SCENARIO.format(kind=kind, prompt=PROMPT))) for kind in MATCHING]
    run = parity("explain", *files, str(SCENARIOS / "rope-scaling.yaml"), out=tmp / "out")
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return {d.name.split("-rope-", 1)[1]: ParityRun(run.code, run.stdout, run.stderr, d)
            for d in sorted((tmp / "out").iterdir())}


def localisation(run: ParityRun, engine: str = "vllm") -> dict:
    found = json.loads((run.run_dir / "explain" / "localisation.json").read_text())["localisations"]
    return next(loc for loc in found if loc["engine"] == engine)


@pytest.mark.parametrize("kind", MATCHING)
def test_hf_and_vllm_agree_past_the_switch(runs: dict[str, ParityRun], kind: str) -> None:
    assert runs[kind].verdicts.set_index("engine").loc["vllm"].verdict == "match"
    located = localisation(runs[kind])
    assert located["cause"] == "none", located["verdict"]


@pytest.mark.parametrize("engine", ["vllm", "llama.cpp"])
def test_longrope_parts_and_explain_says_it_depends_on_the_length(runs: dict[str, ParityRun], engine: str) -> None:
    run = runs["scaling"]
    verdict = run.verdicts.set_index("engine").loc[engine]
    assert verdict.verdict == "diverged" and verdict.first_divergence == 0, verdict.explanation
    located = localisation(run, engine)
    assert located["cause"] == "length", located["verdict"]
    assert located["out_of_floor"]["point"] in ("layers.0.q_rope", "layers.0.k_rope"), located["verdict"]
    assert "traced over the 32 tokens the engines had" in located["verdict"]
    assert "longrope rope chooses its factors by the sequence's length" in located["verdict"]
