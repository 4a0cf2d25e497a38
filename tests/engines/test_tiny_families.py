"""Every tiny family of harness.models.tiny through HF and vLLM, float32 greedy: the same tokens, logprobs within
rounding. One `parity run` per family (one engine load each), past the families' 16-token sliding windows."""

from __future__ import annotations

import pytest

from harness.models.tiny import FAMILIES

from helpers import parity, write_scenario

pytestmark = pytest.mark.engines

SCENARIO = """\
name: tiny-{family}
model: tiny-{family}
dtype: float32
engines:
  hf: {{engine: hf, reference: true}}
  vllm: {{engine: vllm}}
prompts:
  - "The quick brown fox jumps over the lazy dog while"
  - {{id: numbers, text: "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,"}}
params: {{max_new_tokens: 16, ignore_eos: true}}
expect: {{tokens: exact, max_logprob_delta: 0.0001}}
"""


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_and_vllm_match_on_the_tiny_family(family: str, tmp_path) -> None:
    run = parity("run", str(write_scenario(tmp_path / "tiny.yaml", SCENARIO.format(family=family))),
                 out=tmp_path / "reports")
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    verdicts = run.verdicts
    assert set(verdicts.verdict) == {"match"}, verdicts.explanation.tolist()
    results = run.results
    assert results.token_ids.map(len).eq(16).all() and results.prompt_ids.map(len).min() >= 10
