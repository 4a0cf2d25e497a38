"""The tiny mixture-of-experts families (issue 58, item 1) run in HF and vLLM's CPU build and agree token for token
in float32, routers with near ties included: one `parity run` of a scenario per family, the HF and vLLM workers
shared across them. Routing capture and its explain come with the families' maps."""

from __future__ import annotations

import pytest

from harness.models.tiny import FAMILIES

from helpers import ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

MOE = sorted(name for name, family in FAMILIES.items() if family.experts)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, ParityRun]:
    tmp = tmp_path_factory.mktemp("moe")
    files = [write_scenario(tmp / f"{family}.yaml", f"""\
name: tiny-{family}
model: tiny-{family}
engines:
  hf: {{engine: hf, reference: true}}
  vllm: {{engine: vllm}}
prompts:
  - {{id: capital, text: "The capital of France is a city of art, history and food. Once upon a time"}}
  - {{id: chat, messages: [{{role: user, content: "Name three colours."}}]}}
params: {{temperature: 0, max_new_tokens: 12}}
""") for family in MOE]
    run = parity("run", *map(str, files), out=tmp / "out")
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return {d.name.split("-tiny-", 1)[1]: ParityRun(run.code, run.stdout, run.stderr, d)
            for d in sorted((tmp / "out").iterdir())}


@pytest.mark.parametrize("family", MOE)
def test_hf_and_vllm_agree_on_the_moe_family(runs: dict[str, ParityRun], family: str) -> None:
    verdicts = runs[family].verdicts
    assert set(verdicts.verdict) == {"match"}, verdicts.explanation.tolist()
