"""Engine registry: the built-in engines' descriptions plus any registered through the `llm_parity.engines`
entry-point group, and whether each can run in a given interpreter.

Engine modules import their engine package lazily (inside the Engine class), so loading every description is cheap
and works without any engine installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import metadata
from typing import Any

from adapters.contract import EngineDescription, EngineOptions, Requirement, import_object
from harness.core.errors import ConfigError, EngineUnavailable
from harness.core.paths import PROJECT_ROOT

# name -> the module of each engine that ships with the harness: a command imports only the engines it names (all of
# them cost 0.1 s and pull in numpy and asyncio); tests/unit/test_registry.py checks each module's DESCRIPTION.name
BUILTIN = {"hf": "adapters.engines.hf", "vllm": "adapters.engines.vllm_offline",
           "vllm-server": "adapters.engines.vllm_server", "openai": "adapters.engines.openai",
           "lmdeploy": "adapters.engines.lmdeploy_pipeline", "lmdeploy-server": "adapters.engines.lmdeploy_server",
           "llama.cpp": "adapters.engines.llamacpp", "llama.cpp-server": "adapters.engines.llamacpp_server"}
ENTRY_POINT_GROUP = "llm_parity.engines"
CUDA_PROBE = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"


@dataclass(frozen=True)
class BrokenPlugin:
    """An entry point that did not load, listed by `parity engines` with the reason."""

    name: str
    target: str
    error: str


@cache
def _builtin(name: str) -> EngineDescription:
    return importlib.import_module(BUILTIN[name]).DESCRIPTION


@lru_cache(maxsize=1)
def _load() -> tuple[dict[str, EngineDescription], tuple[BrokenPlugin, ...]]:
    found = {name: _builtin(name) for name in BUILTIN}
    broken = []
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            description = point.load()
            description = description() if callable(description) and not isinstance(
                description, EngineDescription) else description
            if not isinstance(description, EngineDescription):
                raise TypeError(f"{point.value} is a {type(description).__name__}, not an EngineDescription")
        except Exception as exc:  # a third-party plugin that fails to load must not break the harness
            broken.append(BrokenPlugin(point.name, point.value, f"{type(exc).__name__}: {exc}"))
            continue
        if description.name in found:
            broken.append(BrokenPlugin(point.name, point.value, f"engine name '{description.name}' is taken"))
            continue
        found[description.name] = description
    return found, tuple(broken)


def descriptions() -> dict[str, EngineDescription]:
    return _load()[0]


def broken_plugins() -> tuple[BrokenPlugin, ...]:
    return _load()[1]


def describe(name: str) -> EngineDescription:
    if name in BUILTIN:
        return _builtin(name)
    try:
        return descriptions()[name]
    except KeyError:
        raise ConfigError(f"unknown engine '{name}': known engines are {', '.join(descriptions())}") from None


def validate_options(name: str, options: dict[str, Any]) -> EngineOptions:
    return describe(name).parse_options(options)


def pinned_version(requirement: Requirement) -> str | None:
    """The version the project pins for the engine's distribution: in its extra, else in its engine environment."""
    from adapters.envs import declared

    wanted = requirement.distribution.lower().replace("_", "-")
    pins = _project_pins()
    pins += [r for env in declared().values() for r in env.get("requirements", [])]
    for pin in pins:
        name, _, rest = pin.partition("==")
        if name.split("[")[0].strip().lower().replace("_", "-") == wanted and rest:  # extras: name[server]==1.0
            return rest.split(";")[0].strip()
    return None


def _project_pins() -> list[str]:
    """The requirements of the project and its extras: from its pyproject.toml where the source tree is here (what
    this checkout pins), else from the installed package's metadata."""
    import tomllib

    path = PROJECT_ROOT / "pyproject.toml"
    if path.exists():
        project = tomllib.loads(path.read_text()).get("project", {})
        return [*project.get("dependencies", []), *(r for extra in project.get("optional-dependencies", {}).values()
                                                   for r in extra)]
    return list(metadata.requires("llm-parity") or []) if _installed("llm-parity") else []


def _installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
        return True
    except metadata.PackageNotFoundError:
        return False


def install_hint(requirement: Requirement) -> str:
    version = pinned_version(requirement)
    pinned = f"{requirement.distribution}=={version}" if version else requirement.distribution
    if requirement.env:
        return f"parity env create {requirement.env} (then python: .venvs/{requirement.env}/bin/python in the scenario)"
    if requirement.extra:
        return f"pip install 'llm-parity[{requirement.extra}]' ({pinned})"
    return f"pip install {pinned}"


def installed_version(requirement: Requirement, python: str | None = None) -> str | None:
    """The engine distribution's version in the interpreter that runs it (None: not installed there)."""
    if python is None:
        try:
            return metadata.version(requirement.distribution)
        except metadata.PackageNotFoundError:
            return None
    code = ("import sys; from importlib import metadata\ntry: print(metadata.version(sys.argv[1]))\n"
            "except metadata.PackageNotFoundError: pass")
    found = _run(python, [code, requirement.distribution])
    if isinstance(found, str):
        return None
    return found.stdout.strip() or None


def _run(python: str, args: list[str]) -> subprocess.CompletedProcess | str:
    try:  # a relative interpreter path (.venvs/NAME/bin/python) is relative to the project, as for workers
        return subprocess.run([python, "-c", *args], capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"interpreter {python} cannot run ({exc})"


def _probe(python: str | None, code: str) -> bool | str:
    """Run code in the interpreter; True if it exits 0, False if not, a reason string if it cannot run."""
    done = _run(python or sys.executable, [code])
    return done if isinstance(done, str) else done.returncode == 0


@cache
def _cuda_available(python: str | None) -> bool | str:
    """_probe of CUDA_PROBE, asked once per interpreter and process: importing torch to ask costs seconds, and
    `parity engines` asks it for every engine that needs CUDA."""
    return _probe(python, CUDA_PROBE)


def check_available(name: str, python: str | None = None, options: dict[str, Any] | None = None,
                    device: bool = True) -> str | None:
    """None when the engine can run with the given interpreter, else the reason it cannot. device False checks the
    package only (enough for its sampling code: `parity params`, `parity transplant`)."""
    return availability(describe(name), python, options, device)


def availability(description: EngineDescription, python: str | None = None, options: dict[str, Any] | None = None,
                 device: bool = True) -> str | None:
    """check_available for an engine whose description is already in hand."""
    name = description.name
    requirement = description.requirement
    if python is None:
        found: bool | str = importlib.util.find_spec(requirement.module) is not None
    else:
        found = _probe(python, f"import importlib.util,sys; sys.exit(importlib.util.find_spec({requirement.module!r}) "
                               "is None)")
    if isinstance(found, str):
        return f"engine {name}: {found}"
    if not found:
        return f"engine {name} needs: {install_hint(requirement)}"
    why = description.cuda_reason(options or {}) if device else None
    if why and _cuda_available(python) is not True:
        return (f"engine {name} needs a CUDA GPU ({why}): "
                f"torch.cuda.is_available() is false in {python or sys.executable}")
    return None


def require_available(name: str, python: str | None = None, options: dict[str, Any] | None = None) -> None:
    reason = check_available(name, python, options)
    if reason:
        raise EngineUnavailable(reason)


def engine_class(factory: str) -> type:
    """The Engine class named by a description's factory ('module:Class'), imported inside a worker."""
    return import_object(factory)
