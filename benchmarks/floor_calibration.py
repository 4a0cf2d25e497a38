"""The measured false-alarm check behind the layer-forced noise floor's k (harness/compare/layer_floor.py RULES).

Runs `parity explain` over the shipped clean pairs and planted-fault scenarios, each engine's layers forced from the
reference's input, and reads explain/points.parquet: for a clean engine the largest error/floor ratio of any point
of any explained case (what k must stay above), for a planted fault the ratio at the point it was planted in (what
k must stay below). Prints both per engine and, per dtype, the widest clean ratio, the narrowest fault ratio and the
k in use; exits 1 where that k does not sit strictly between them (a false alarm or a missed fault), 0 otherwise.

    python benchmarks/floor_calibration.py [--quick]   (--quick: without the long Gemma 3 prompt)

Clean pairs (the issue's list): HF vs vLLM on SmolLM2 (bf16-greedy.yaml), Gemma 3 (gemma3-bf16.yaml, and at 690
positions), the tiny qwen3_moe (moe-bf16.yaml), a LoRA adapter (lora-bf16.yaml), and float16 with llama.cpp on an F16
GGUF (fp16.yaml); float32: HF vs vLLM (quickstart.yaml). Faults: bf16-planted-fault.yaml, the faulty copies of
gemma3-bf16.yaml and moe-bf16.yaml (2% each), planted-fault.yaml in float32.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.compare.layer_floor import RULES  # noqa: E402

SCENARIOS = ROOT / "scenarios"
# (scenario, engine) -> the point its fault was planted in ("": any point: another model, not one component); every
# other engine is a clean pair
PLANTED = {("bf16-planted-fault", "mlp-fault"): "layers.15.mlp", ("bf16-planted-fault", "v-head-fault"): "layers.9.v",
           ("bf16-planted-fault", "norm-fault"): "layers.21.post_norm",
           ("bf16-planted-fault", "vllm-mlp-fault"): "layers.8.mlp",
           ("gemma3-bf16", "mlp-half-fault"): "layers.9.mlp", ("moe-bf16", "expert-fault"): "layers.1.moe",
           ("moe-bf16", "router-fault"): "layers.1.router", ("planted-fault", "v-fault"): "layers.7.v",
           ("planted-fault", "mlp-fault"): "layers.26.mlp", ("lora-bf16", "base"): ""}
LONG_GEMMA = """\
name: gemma3-bf16-long
model: gemma3-270m
dtype: bfloat16
engines:
  hf: {engine: hf, reference: true}
  vllm: {engine: vllm}
prompts:
  - file: %s
params: {temperature: 0, max_new_tokens: 2}
expect: {tokens: any}
"""


def explain(files: list[Path], out: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "harness", "explain", *map(str, files), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    if done.returncode not in (0, 1) or not any(out.glob("*/explain/points.parquet")):  # 1: a scenario whose
        # expectations fail (the faults' may)
        sys.exit(f"parity explain exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def readings(out: Path) -> pd.DataFrame:
    rows = []
    for run_dir in sorted(p for p in out.iterdir() if (p / "explain" / "points.parquet").exists()):
        meta = json.loads((run_dir / "run.json").read_text())
        points = pd.read_parquet(run_dir / "explain" / "points.parquet")
        localised = json.loads((run_dir / "explain" / "localisation.json").read_text())
        forced = set(localised.get("forced", []))
        for engine, own in points.groupby("engine"):
            planted = PLANTED.get((meta["scenario_name"], engine))
            judged = own[own["point"] == planted] if planted else own
            worst = judged.loc[judged["ratio"].idxmax()]
            rows.append({"scenario": meta["scenario_name"], "dtype": meta["engines"][meta["reference"]]["dtype"],
                         "engine": engine, "kind": "clean" if planted is None else "fault",
                         "forced": engine in forced,
                         "point": worst["point"], "ratio": float(worst["ratio"]),
                         "threshold": float(own["sensitivity"].max()) if "sensitivity" in own else float("nan")})
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="leave out Gemma 3 at 690 positions")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "reports"
        files = [SCENARIOS / f"{name}.yaml" for name in (
            "bf16-greedy", "bf16-planted-fault", "gemma3-bf16", "moe-bf16", "lora-bf16", "fp16", "quickstart",
            "planted-fault")]
        if not args.quick:
            long = Path(tmp) / "gemma3-bf16-long.yaml"
            long.write_text(LONG_GEMMA % (SCENARIOS / "gemma3-long-prompt.jsonl"))
            files.append(long)
        wall = explain(files, out)
        table = readings(out)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"\n{len(files)} scenarios explained in {wall:.0f} s")
    failed = False
    for dtype, rows in table[table["forced"]].groupby("dtype"):
        clean, faults = rows[rows["kind"] == "clean"], rows[rows["kind"] == "fault"]
        widest = clean["ratio"].max() if len(clean) else float("nan")
        narrowest = faults["ratio"].min() if len(faults) else float("nan")
        k = RULES[dtype].k
        ok = not (widest >= k or narrowest <= k)
        failed |= not ok
        faults = f"planted faults at least {narrowest:.3g}x" if len(faults) else "no planted faults"
        print(f"{dtype}: clean pairs at most {widest:.3g}x their floor, {faults}; k = {k:g} "
              f"{'separates them' if ok else 'does NOT separate them'}; largest threshold "
              f"{rows['threshold'].max():.3g} (relative L2)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
