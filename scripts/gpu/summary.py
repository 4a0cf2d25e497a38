"""Summary of a GPU check: read the run directories it left under REPORTS and print what the check is for: greedy
parity (false divergences), the server path giving per-step logprobs, pipeline-vs-server defaults, and what the
fp16 temperature hazard did on this device.

Usage: python scripts/gpu/summary.py REPORTS [--vllm] (--vllm: the vLLM part's runs: greedy verdicts per dtype, eager
and CUDA graphs, vLLM's tokens beside HF's on CUDA, and each explain's first divergent layer and component)
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from harness.rundir.store import read_meta
from harness.rundir.tables import read_parquet


def latest(reports: Path, scenario: str, needs: str = "verdicts.parquet") -> Path | None:
    """The newest run of SCENARIO that wrote NEEDS (a transplant leaves a run of the scenario with no verdicts)."""
    runs = sorted(p for p in reports.glob(f"*-{scenario}") if (p / needs).exists())
    return runs[-1] if runs else None


def greedy(reports: Path, scenario: str) -> list[str]:
    run = latest(reports, scenario)
    if run is None:
        return [f"{scenario}: not run"]
    verdicts = read_parquet(run, "verdicts.parquet")
    steps = read_parquet(run, "steps.parquet")
    lines = []
    for engine, rows in verdicts.groupby("engine", sort=False):
        counts = Counter(rows.verdict)
        false = sum(n for v, n in counts.items() if v not in ("match", "benign_tie"))
        per_case = steps[steps.engine == engine].groupby("case_id").size().to_dict()
        lines.append(f"{scenario} {engine}: {dict(counts)}; divergences that are not near-ties: {false}; "
                     f"steps with logprobs per case: {per_case or 'NONE'}")
        lines += [f"    {r.case_id}: {r.verdict}: {r.explanation[:300]}" for r in rows.itertuples()
                  if r.verdict not in ("match", "benign_tie")]
    return lines


def defaults(reports: Path) -> list[str]:
    run = latest(reports, "gpu-defaults")
    if run is None:
        return ["gpu-defaults: not run"]
    results = read_parquet(run, "results.parquet")
    lines = []
    for row in results.itertuples():
        effective = json.loads(row.effective or "{}")
        lines.append(f"gpu-defaults {row.engine}: decoding {effective.get('decoding', '?')}, temperature "
                     f"{effective.get('temperature')}, top_k {effective.get('top_k')}; generated "
                     f"{len(row.token_ids)} tokens")
    return lines


def hazard(reports: Path) -> list[str]:
    run = latest(reports, "gpu-hazard")
    if run is None:
        return ["gpu-hazard: not run"]
    verdicts = read_parquet(run, "verdicts.parquet")
    lines = [f"gpu-hazard {r.case_id} {r.engine}: {r.explanation[:400]}" for r in verdicts.itertuples()]
    transplanted = latest(reports, "gpu-hazard", needs="transplant/verdicts.json")
    if transplanted is None:
        return [*lines, "gpu-hazard transplant: not run"]
    for found in json.loads((transplanted / "transplant" / "verdicts.json").read_text()):
        lines.append(f"gpu-hazard transplant {found['case_id']} {found['engine']}: {found['cause']}: "
                     f"{found['verdict'][:400]}")
    return lines


def beside(reports: Path, scenario: str, base: str = "hf-cuda") -> list[str]:
    """Each engine's tokens against BASE's (HF on the same GPU) rather than the reference's (HF on the CPU): the
    cases where they agree, and where they part, the step and both tokens."""
    run = latest(reports, scenario)
    if run is None:
        return []
    results = read_parquet(run, "results.parquet")
    ok = results[results.status == "ok"]
    theirs = {r.case_id: [int(t) for t in r.token_ids] for r in ok[ok.engine == base].itertuples()}
    if not theirs:
        return [f"{scenario} beside {base}: {base} has no answers"]
    reference = read_meta(run).reference
    lines = []
    for engine, rows in ok[~ok.engine.isin([base, reference])].groupby("engine", sort=False):
        parted, same = [], 0
        for row in rows.itertuples():
            mine, base_ids = [int(t) for t in row.token_ids], theirs.get(row.case_id)
            same += mine == base_ids
            if base_ids is None or mine == base_ids:
                continue
            step = next((i for i, (a, b) in enumerate(zip(mine, base_ids)) if a != b), min(len(mine), len(base_ids)))
            parted.append(f"{row.case_id} at step {step} (token {token_at(base_ids, step)} against "
                          f"{token_at(mine, step)})")
        lines.append(f"{scenario} {engine} beside {base}: same tokens in {same} of {len(rows)} cases"
                     + (f"; parts: {', '.join(parted)}" if parted else ""))
    return lines


def token_at(ids: list[int], step: int) -> str:
    return str(ids[step]) if step < len(ids) else "(end)"


def explained(reports: Path, scenario: str) -> list[str]:
    """An explain's answer per engine: the first point that leaves the noise floor (layer and component), or why
    none does."""
    run = latest(reports, scenario, needs="explain/localisation.json")
    if run is None:
        return [f"{scenario} explain: not run"]
    data = json.loads((run / "explain" / "localisation.json").read_text())
    lines = []
    for loc in data["localisations"]:
        out = loc.get("out_of_floor") or {}
        where = f"first out of the floor: {out['point']} ({out['cause']}), {out['ratio']:.3g}x the floor" if out \
            else "no point out of the floor"
        lines.append(f"{scenario} explain {loc['case_id']} {loc['engine']}: {loc['cause']}; {where}")
    return lines


def main() -> int:
    reports = Path(sys.argv[1])
    any_run = next((p for p in sorted(reports.glob("*")) if (p / "run.json").exists()), None)
    if any_run is None:
        print(f"no run directories under {reports}")
        return 1
    meta = read_meta(any_run)
    shown = ("lmdeploy", "vllm", "model_runner", "attention", "torch", "gpu", "device", "cuda")
    versions = {k: v for e in meta.engines.values() for k, v in e.versions.items() if k in shown}
    print(f"== GPU check summary ({', '.join(f'{k} {v}' for k, v in versions.items())})")
    if "--vllm" in sys.argv:
        parts = [line for scenario in ("gpu-vllm-fp16", "gpu-vllm-bf16") for line in
                 (*greedy(reports, scenario), *beside(reports, scenario), *explained(reports, scenario))]
    else:
        parts = [*greedy(reports, "gpu-greedy-fp16"), *greedy(reports, "gpu-greedy-bf16"), *defaults(reports),
                 *hazard(reports)]
    for line in parts:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
