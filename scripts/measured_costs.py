"""Turn the run directories of a pilot run on the target hardware into the `costs:` entries of a `parity run --plan`
file: per (model, engine type), the load time (worker start, imports, model load) and the generation time per
generated token, averaged over the runs given.

    python scripts/measured_costs.py reports/2026*-nightly-*  >> my-cluster.yaml

Each entry is printed with the runs and figures it came from, so a reviewer can tell measured costs from assumed ones.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd


def engine_figures(run_dir: Path) -> list[tuple[str, str, float, float, int, int]]:
    """(model, engine type, load seconds, generate seconds, requests, generated tokens) per engine of one run."""
    meta = json.loads((run_dir / "run.json").read_text())
    results = pd.read_parquet(run_dir / "results.parquet", columns=["engine", "status", "token_ids", "samples"])
    out = []
    for name, engine in meta["engines"].items():
        phases = engine.get("phases") or {}
        if "generate_s" not in phases:
            continue  # the engine never ran (unavailable, or failed to load)
        mine = results[(results["engine"] == name) & (results["status"] == "ok")]
        tokens = int(sum(len(ids) + sum(len(s) for s in samples)
                         for ids, samples in zip(mine["token_ids"], mine["samples"], strict=True)))
        load = sum(phases.get(key, 0.0) for key in ("process_start_s", "imports_s", "load_s"))
        out.append((meta["model"], engine["engine"], load, phases["generate_s"], len(mine), tokens))
    return out


def main(run_dirs: list[Path]) -> int:
    missing = [d for d in run_dirs if not (d / "run.json").is_file() or not (d / "results.parquet").is_file()]
    if not run_dirs or missing:
        print(f"error: {missing[0] if missing else 'no run directory given'}: expected run directories of "
              "`parity run` (with run.json and results.parquet)", file=sys.stderr)
        return 2
    grouped: dict[tuple[str, str], list[tuple[float, float, int, int]]] = defaultdict(list)
    for run_dir in run_dirs:
        for model, engine, *figures in engine_figures(run_dir):
            grouped[(model, engine)].append(tuple(figures))
    print(f"# measured by scripts/measured_costs.py from {len(run_dirs)} run(s): {', '.join(d.name for d in run_dirs)}")
    print("costs:")
    for (model, engine), rows in sorted(grouped.items()):
        load = sum(r[0] for r in rows) / len(rows)
        generate, requests, tokens = (sum(r[i] for r in rows) for i in (1, 2, 3))
        token_s = generate / tokens if tokens else 0.0
        case_s = 0.0 if tokens else generate / max(requests, 1)
        print(f"  - {{model: '{model}', engine: {engine}, load_s: {load:.1f}, case_s: {case_s:.3f}, "
              f"token_s: {token_s:.4f}}}  # {len(rows)} engine run(s), {requests} requests, {tokens} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main([Path(arg) for arg in sys.argv[1:]]))
