"""What the Ray executor costs on one machine: the shipped CPU scenarios in one `parity run` with `--executor local`
(subprocess workers) and with `--executor ray` (a Ray instance started on this machine, each engine worker an actor).

Both sides run the same command but for the executor flag, with --allow-missing (engines this machine cannot run,
lmdeploy's pipeline on CPU, are skipped the same way on both sides); every run must finish, and each scenario's
exit code (0, or 1 where its verdicts say so) must be the same on every run. The sides alternate over repeats
(local, ray, local, ray...). Each is timed from outside (wall) and broken down from its run.json files: the
driver's start and planning (for ray: starting the Ray instance), the engine phase (all engines, in parallel as the
executor allows), judging and writing results (GGUF drift included); and, summed over engines, worker start,
imports, model load and generation.

Usage: python benchmarks/ray_overhead.py [--repeats 2] [SCENARIO ...]
Target (issue 18): ray <= 1.2x local wall time, medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["quickstart", "penalty-semantics", "temperature-hazard", "llamacpp"]
ENGINE_PHASES = ("process_start_s", "imports_s", "load_s", "generate_s")
EXITS: dict[str, dict[str, int]] = {}  # each scenario's exit code must be the same on every run, either executor


def run(executor: str, scenarios: list[Path], out: Path) -> dict[str, float]:
    """One `parity run` of every scenario; its wall time and where the time went."""
    cmd = [sys.executable, "-m", "harness", "run", *map(str, scenarios), "--allow-missing", "--executor", executor,
           "--out", str(out)]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - started
    if proc.returncode not in (0, 1):  # 1: a case out of expectation, as penalty-semantics.yaml shows on purpose
        sys.exit(f"{' '.join(cmd[2:])} exited {proc.returncode}:\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    metas = [json.loads((d / "run.json").read_text()) for d in sorted(out.iterdir())]
    if len(metas) != len(scenarios) or any(m["status"] != "finished" for m in metas):
        sys.exit(f"expected {len(scenarios)} finished runs in {out}, found {[m['status'] for m in metas]}")
    exits = {m["scenario_name"]: m["exit_code"] for m in metas}
    if EXITS.setdefault("first", exits) != exits:
        sys.exit(f"{executor}: scenario exit codes {exits} differ from the first run's {EXITS['first']}")
    engines_s = max(m["phases"]["engines_s"] for m in metas)  # one engine phase serves every scenario
    judge_s = sum(m["phases"]["write_s"] for m in metas)  # verdicts, drift, files
    figures = {"wall_s": wall, "driver_start_s": wall - engines_s - judge_s, "engines_s": engines_s,
               "judge_and_write_s": judge_s}
    for phase in ENGINE_PHASES:
        figures[f"sum {phase}"] = sum(e.get("phases", {}).get(phase, 0.0) for m in metas
                                      for e in m["engines"].values())
    figures["engine runs"] = sum(1 for m in metas for e in m["engines"].values() if e.get("phases"))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("scenarios", nargs="*", default=DEFAULT, help="names under scenarios/ or paths")
    args = parser.parse_args()
    scenarios = [Path(s) if s.endswith(".yaml") else ROOT / "scenarios" / f"{s}.yaml" for s in args.scenarios]
    measured: dict[str, list[dict[str, float]]] = {"local": [], "ray": []}
    with tempfile.TemporaryDirectory(prefix="ray-overhead-") as tmp:
        for repeat in range(args.repeats):
            for executor in ("local", "ray"):
                figures = run(executor, scenarios, Path(tmp) / f"{executor}-{repeat}")
                measured[executor].append(figures)
                print(f"repeat {repeat + 1} {executor}: {figures['wall_s']:.1f} s wall", flush=True)
    print(f"\n{len(scenarios)} scenarios ({', '.join(s.stem for s in scenarios)}), medians of {args.repeats}:")
    print(f"{'':24}{'local':>10}{'ray':>10}")
    for key in measured["local"][0]:
        local, ray = (statistics.median(r[key] for r in measured[side]) for side in ("local", "ray"))
        print(f"{key:24}{local:10.1f}{ray:10.1f}")
    ratio = statistics.median(r["wall_s"] for r in measured["ray"]) / statistics.median(
        r["wall_s"] for r in measured["local"])
    spread = {side: f"{min(r['wall_s'] for r in runs):.1f}-{max(r['wall_s'] for r in runs):.1f} s"
              for side, runs in measured.items()}
    print(f"\nray / local wall time: {ratio:.2f}x (target <= 1.2x); spread local {spread['local']}, "
          f"ray {spread['ray']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
