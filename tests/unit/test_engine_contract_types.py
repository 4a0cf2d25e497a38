"""The engine contract, type-checked: mypy (mypy.ini) holds every built-in Engine class to the protocols of
adapters/contract.py through adapters/conformance.py, and the adapters' own code to its annotations."""

from __future__ import annotations

import ast
import subprocess
import sys

from adapters import registry

from helpers import ROOT


def test_mypy_passes_on_the_adapters_and_the_engine_contract(tmp_path) -> None:
    """A cold cache in tmp_path: mypy reads no engine package (mypy.ini skips them), so a cold run takes seconds even
    on 2 cores, and a cache of its own cannot answer from another checkout's state or race a parallel pytest worker."""
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "mypy.ini"),
                           "--cache-dir", str(tmp_path / "mypy_cache")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mypy failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"


def _checked_engines() -> dict[str, set[str]]:
    """adapters/conformance.py read as written: engine module -> the protocols its Engine class is returned as."""
    tree = ast.parse((ROOT / "adapters" / "conformance.py").read_text())
    modules: dict[str, str] = {}
    checked: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "adapters.engines":
            modules.update({alias.asname or alias.name: f"adapters.engines.{alias.name}" for alias in node.names})
        if isinstance(node, ast.FunctionDef):  # def NAME(setup: EngineSetup) -> Protocol: return module.Engine(setup)
            built = node.body[-1]
            assert isinstance(node.returns, ast.Name) and isinstance(built, ast.Return), ast.unparse(node)
            call = built.value
            assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute), ast.unparse(node)
            assert isinstance(call.func.value, ast.Name) and call.func.attr == "Engine", ast.unparse(node)
            checked.setdefault(modules[call.func.value.id], set()).add(node.returns.id)
    return checked


def test_conformance_checks_every_builtin_engine_against_its_capabilities() -> None:
    """Every module of registry.BUILTIN is in adapters/conformance.py, against TracingEngine if it traces,
    ScoringEngine if it scores, Engine otherwise: the ops the worker may send it."""
    expected = {}
    for name, module in registry.BUILTIN.items():
        capabilities = registry.describe(name).capabilities
        protocols = {"TracingEngine"} if capabilities.traces else set()
        protocols |= {"ScoringEngine"} if capabilities.scores else set()
        expected[module] = protocols or {"Engine"}
    assert _checked_engines() == expected
