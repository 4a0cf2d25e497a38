"""The house rules, checked: the layers and the acyclic packages of .importlinter (imports inside functions and under
TYPE_CHECKING count, nothing is exempt), module paths held as strings pointing at modules that exist in the same or
a lower layer, planning that resolves each engine's description once, and the run types importable without pandas."""

from __future__ import annotations

import configparser
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from adapters import registry
from harness.plan.plans import plan_resources
from harness.plan.requests import plan_engines
from harness.run.execute import Selection, runnable
from harness.scenario.spec import load

ROOT = Path(__file__).resolve().parents[2]
MODULE_STRING = re.compile(r"""["'](?:-m )?((?:harness|adapters)(?:\.\w+)+)(?::\w+)?["']""")


def layers() -> list[list[str]]:
    """.importlinter's layers, top first, each a list of sibling packages."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    lines = config["importlinter:contract:layers"]["layers"].strip().splitlines()
    return [[name.strip() for name in line.split("|")] for line in lines]


def layer_of(module: str) -> int:
    for index, siblings in enumerate(layers()):
        if any(module == name or module.startswith(name + ".") for name in siblings):
            return index
    raise AssertionError(f"{module} is in no layer of .importlinter: add its package to the layers contract")


def test_the_import_contracts_hold() -> None:
    proc = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                           "lint_imports_command()"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_every_package_is_in_a_layer() -> None:
    packages = {".".join(p.relative_to(ROOT).parts[:2]).removesuffix(".py")
                for p in [*ROOT.glob("harness/*"), *ROOT.glob("adapters")] if p.name != "__pycache__"
                and (p.suffix == ".py" or (p / "__init__.py").exists()) and p.name != "__init__.py"}
    for package in sorted(packages):
        layer_of(package)


def test_module_paths_held_as_strings_exist_and_point_down() -> None:
    """The worker started with `python -m`, engine factories, sampling code and built-in plug-ins are imported by
    name at run time, where import-linter cannot see them: each must name a module that exists, in the holder's
    layer or below."""
    checked = 0
    for path in [*ROOT.glob("harness/**/*.py"), *ROOT.glob("adapters/**/*.py")]:
        holder = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for target in MODULE_STRING.findall(path.read_text()):
            assert importlib.util.find_spec(target) is not None, f"{holder} names {target}, which does not exist"
            assert layer_of(holder) <= layer_of(target), f"{holder} names {target}, a module of a higher layer"
            checked += 1
    assert checked > 20


def test_planning_resolves_each_engine_description_once(monkeypatch) -> None:
    calls = []
    describe = registry.describe
    monkeypatch.setattr(registry, "describe", lambda name: calls.append(name) or describe(name))
    scenario = load(ROOT / "scenarios" / "quickstart.yaml")
    assert sorted(calls) == sorted(e.engine for e in scenario.spec.engines.values())  # once each, when loaded
    calls.clear()
    # narrowed, params checked by each engine's code, availability, each engine's model and adapter resolved
    ready, _ = runnable(scenario, Selection(), resolve=lambda model, dtype, origin: Path(model))
    for name in ready.spec.engines:
        plan_resources(ready, name)
    prompt_ids = {c.prompt.id: [1, 2, 3] for c in ready.cases}
    plan_engines(ready, Path("/nonexistent"), prompt_ids)
    assert calls == []


def test_the_run_types_load_neither_pandas_nor_the_verdict_rules() -> None:
    code = ("import sys, harness.run.outcome; "
            "print(sorted(m for m in sys.modules if m == 'pandas' or m.startswith(('harness.compare', "
            "'harness.verdicts'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
