"""Each engine of a scenario is resolved once (issue 75, item 9): its model's folder, its adapter and its load key are
found when a command has chosen the engines it runs, and every plan of the run and of explain is assembled from that
record. Resolving checks the model's folder on disk (catalog.model_problem) and reads the adapter (lora.read): both
are counted here, through every planning step of `parity run` and `parity explain`. The model and the adapter are
small folders the test writes (no engine, no model build)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from harness.models import catalog, lora
from harness.plan import invariance_checks
from harness.plan.plans import engine_plan
from harness.plan.requests import plan_engines
from harness.run.execute import Selection, _drift_keys, runnable
from harness.run.trace_passes import explained_engines, loads_reused, noise_floor_dtype, plan_passes
from harness.scenario.spec import load

from helpers import write_scenario

Q = "model.layers.0.self_attn.q_proj"


def model_and_adapter(tmp_path: Path) -> tuple[Path, Path]:
    """A base model folder (config.json, one q_proj weight) and a rank-2 PEFT adapter of its q_proj."""
    base, adapter = tmp_path / "base", tmp_path / "adapter"
    base.mkdir()
    adapter.mkdir()
    (base / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    save_file({f"{Q}.weight": np.zeros((8, 8), np.float32)}, str(base / "model.safetensors"))
    save_file({f"base_model.model.{Q}.lora_A.weight": np.ones((2, 8), np.float32),
               f"base_model.model.{Q}.lora_B.weight": np.ones((8, 2), np.float32)}, str(adapter / lora.WEIGHTS))
    (adapter / lora.CONFIG).write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4}))
    return base, adapter


@pytest.fixture
def counted(monkeypatch) -> dict[str, int]:
    """How many times a model folder was checked and an adapter read, from the moment the fixture is asked for."""
    counts = {"model": 0, "adapter": 0}
    check, read = catalog.model_problem, lora.read

    def checked(model: str) -> str | None:
        counts["model"] += 1
        return check(model)

    def adapter_read(path: Path) -> lora.AdapterInfo:
        counts["adapter"] += 1
        return read(path)

    monkeypatch.setattr(catalog, "model_problem", checked)
    monkeypatch.setattr(lora, "read", adapter_read)
    return counts


def scenario_file(tmp_path: Path) -> Path:
    """Two HF engines applying the scenario's adapter, one with a drift verdict and an invariance knob."""
    base, adapter = model_and_adapter(tmp_path)
    return write_scenario(tmp_path / "s.yaml", f"""\
model: {base}
lora: {adapter}
engines:
  ref: {{engine: hf, reference: true}}
  other: {{engine: hf, drift: {{}}, invariance: [batch]}}
prompts: [{{id: p, text: hi}}, {{id: q, text: there}}]
params: {{temperature: 0, max_new_tokens: 2}}
""")


def test_run_and_explain_plan_from_one_resolution_per_engine(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    scenario = load(scenario_file(tmp_path))
    counted = request.getfixturevalue("counted")  # from here on: the command's work
    ready, _ = runnable(scenario, Selection())  # `parity run`: the engines chosen (and resolved)
    run_dir = tmp_path / "run"
    base_plans = plan_engines(ready, run_dir, {"p": [1, 2], "q": [3]})
    plans, _ = invariance_checks.plan(ready, base_plans, run_dir, [7, 7, 7])
    kept = _drift_keys(ready)  # what stays loaded for the drift verdicts' passes
    assert counted == {"model": 2, "adapter": 2}  # one each per engine

    traceable, scorable = explained_engines(ready)  # `parity explain`: the loads it reuses, its passes, kept rows
    reused = loads_reused(ready, traceable, scorable)
    floor = noise_floor_dtype("hf", "float32")
    passes = plan_passes(ready, run_dir, [], traceable, scorable, floor, True, 2).plans
    rows = engine_plan(ready, "other", run_dir, [], op="trace")
    # the noise floor computes on the run's own model folder (its weights in higher precision): nothing more
    assert floor == "float64" and counted == {"model": 2, "adapter": 2}
    # what the run keeps loaded is what explain's passes load
    assert {p.load_key for p in base_plans} == set(kept) == set(reused) == {p.load_key for p in (*passes[:-1], rows)}
    assert [(p.dtype, p.setup.weights_dtype) for p in passes][-1] == ("float64", "float32")
    assert passes[-1].setup.model_path == passes[0].setup.model_path
    assert all(p.setup.lora is not None and p.setup.lora.rank == 2 for p in (*plans, *passes, rows))


def test_an_engine_resolved_before_its_run_is_not_resolved_again(tmp_path: Path,
                                                                 request: pytest.FixtureRequest) -> None:
    """explain and transplant resolve the engines whose loads they keep before the run starts; the run keeps those
    records. Planning an engine nobody resolved is a mistake of the harness, said as such."""
    scenario = load(scenario_file(tmp_path))
    counted = request.getfixturevalue("counted")
    with pytest.raises(LookupError, match="engine ref of .* is planned before it was resolved"):
        engine_plan(scenario, "ref", tmp_path, [])
    early = scenario.with_resolved(["ref"])
    ready, _ = runnable(early, Selection())
    assert counted == {"model": 2, "adapter": 2} and ready.engine("ref") is early.engine("ref")
