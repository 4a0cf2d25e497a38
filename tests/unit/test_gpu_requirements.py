"""scripts/gpu/requirements_check.py: what the GPU check carries leaves no requirement unmet on the GPU image, checked
here before a rare GPU session finds it there (the vLLM part once carried no gguf, which `parity models prepare`
needs, and would have stopped at its first step; the lmdeploy part no jsonschema, which constrained outputs import)."""

from __future__ import annotations

import importlib.util
import re
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "scripts" / "gpu"


def load_checker():
    spec = importlib.util.spec_from_file_location("requirements_check", GPU / "requirements_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checker = load_checker()


def wheel(folder: Path, name: str, requires: list[str]) -> Path:
    path = folder / f"{name}-1.0-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "")
        archive.writestr(f"{name}-1.0.dist-info/METADATA", meta)
    return path


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    image = tmp_path / "image.txt"
    image.write_text("# names\ntorch\nPyYAML\n")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "llm-parity"\n'
                         'dependencies = ["torch>=2.4", "pyyaml==6.0.3", "gguf==0.19"]\n')
    wheels = [wheel(tmp_path, "compressed_tensors", ["torch>=2.10", "loguru", "pytest; extra == 'dev'",
                                                     "colorama; sys_platform == 'win32'"]),
              wheel(tmp_path, "Pydantic_Core", ["typing-extensions"])]
    return image, pyproject, wheels


def run(layout, capsys, left_out: str = "") -> tuple[int, str, str]:
    image, pyproject, wheels = layout
    code = checker.main(["--image", str(image), "--left-out", left_out, str(pyproject), *map(str, wheels)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_each_requirement_nobody_provides_is_named_with_who_needs_it(layout, capsys) -> None:
    code, out, err = run(layout, capsys)
    assert code == 1 and out == ""
    named = re.findall(r"requirements: (.+?) is neither", err)
    # extras and other platforms' requirements are not needed there; names compare canonically (PyYAML, pyyaml)
    assert named == ["gguf (required by llm-parity)", "loguru (required by compressed-tensors)",
                     "typing-extensions (required by pydantic-core)"]


def test_left_out_on_purpose_or_carried_passes_with_a_count(layout, capsys, tmp_path: Path) -> None:
    layout[2].append(wheel(tmp_path, "gguf", ["numpy>=1.17"]))
    code, out, err = run(layout, capsys, left_out="loguru typing_extensions numpy")
    assert (code, err) == (0, "")
    assert out == ("requirements: llm-parity's and the 3 carried packages' are in the image or carried "
                   "(3 left out on purpose)\n")


def shell_list(script: Path, variable: str) -> set[str]:
    body = re.search(rf'^{variable}="([^"]*)"', script.read_text(), re.MULTILINE)
    return {checker.canonical(item.split("==")[0]) for item in body.group(1).split()}


@pytest.mark.parametrize("script, variable", [("gpu_check.sh", "GPU_WHEELS"), ("gpu/vllm_part.sh", "VLLM_DEPS")],
                         ids=["lmdeploy-part", "vllm-part"])
def test_each_part_carries_every_dependency_of_llm_parity_the_image_lacks(script: str, variable: str) -> None:
    """A dependency added to pyproject.toml that the GPU image lacks must join each part's carried packages."""
    present = checker.image_packages(GPU / "image-packages.txt") | shell_list(GPU.parent / script, variable)
    _, requirements = checker.project_requirements(ROOT / "pyproject.toml")
    assert [r for r in requirements if checker.needed_there(r) not in present] == []
