"""The benchmarks' plain vLLM side is one script (issue 75, item 9): overhead.py and scale.py run
benchmarks/plain_vllm.py, each with its own settings, not a copy of it each. (The script itself runs whenever those
benchmarks do.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
PLAIN_VLLM = str(ROOT / "benchmarks" / "plain_vllm.py")


def benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_overhead_and_scale_time_vllm_with_one_script_and_their_own_settings() -> None:
    model, ids = Path("model"), Path("ids.json")
    overhead = benchmark("overhead").plain_commands(model, ids, 8)["vllm"]
    scale = benchmark("scale")
    alone, without_cache = (scale.plain_command(e, ids, 8, 1, model, Path()) for e in ("vllm", "vllm-b"))
    assert overhead[1:] == [PLAIN_VLLM, "model", "ids.json", "8", str(64 * 2**20)]
    assert alone[1:] == [PLAIN_VLLM, "model", "ids.json", "8", str(2**30)]
    assert without_cache == [*alone, "--no-prefix-caching"]
