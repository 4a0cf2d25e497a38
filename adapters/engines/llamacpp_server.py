"""`llama.cpp-server` engine: llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`, from the same
build as the `llama.cpp` engine) started by the harness on 127.0.0.1 on a GGUF variant of the scenario's model, or
attached by url; spoken to in the llama-cpp-python dialect (text prompts, token text mapped back to ids, special
tokens written as '', its repeat_penalty 1.1 default neutralised), checked against the live server's request schema
when the engine connects."""

from __future__ import annotations

import os
import sys
from typing import Literal

from pydantic import Field, field_validator

from adapters.contract import Capabilities, EngineDescription, Requirement, SamplingCode
from adapters.engines.llamacpp import GGML_TYPES, gguf_file
from adapters.engines.llamacpp import Options as LibraryOptions
from adapters.http.served import Launch, ServedEngine, ServedOptions, endpoint_checked, installed_version
from harness.types import EngineSetup

DIALECT = "llama-cpp-python"


class Options(ServedOptions):
    _endpoint = endpoint_checked(DIALECT)
    gguf: str = "f32"  # as for the llama.cpp engine: f32, f16, q8_0, q4_k_m, bundled or a path to a .gguf file
    kv_cache: Literal["f32", "f16"] = "f32"
    last_n_tokens: int = Field(64, ge=0)  # the penalties' window (--last_n_tokens_size)
    startup_timeout: float = Field(300, gt=0)

    _gguf = field_validator("gguf")(LibraryOptions._known_variant.__func__)


def command(setup: EngineSetup, port: int, options: Options, gguf: str, threads: int) -> list[str]:
    n_ctx = max(512, -(-(setup.max_context or 512) // 256) * 256)
    kv = str(GGML_TYPES[options.kv_cache])
    return [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1", "--port", str(port),
            "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx),
            "--n_batch", str(n_ctx), "--logits_all", "true", "--type_k", kv, "--type_v", kv,
            "--last_n_tokens_size", str(options.last_n_tokens), *options.extra_args]


class Engine(ServedEngine):
    Options = Options
    DIALECT = DIALECT

    def launch(self, setup: EngineSetup, port: int) -> Launch:
        self.gguf = gguf_file(setup, self.options)
        threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
        return Launch(command(setup, port, self.options, self.gguf, threads), dict(os.environ),
                      health_path="/v1/models")

    def versions(self) -> dict[str, str]:
        info = {**super().versions(), "llama-cpp-python": installed_version("llama-cpp-python")}
        if not self.options.url:
            info["gguf"] = os.path.basename(self.gguf)
        return info


DESCRIPTION = EngineDescription(
    name="llama.cpp-server", engine=Engine, options=Options,
    summary="llama-cpp-python's OpenAI server (python -m llama_cpp.server) started on 127.0.0.1, or attached by url",
    requirement=Requirement(module="llama_cpp", distribution="llama-cpp-python", extra="llamacpp"),
    capabilities=Capabilities(server=True, dtypes=("float32",)),
    sampling=lambda options: SamplingCode("adapters.sampling.llamacpp", {
        "mode": "server", "defaults": options.defaults, "last_n_tokens": options.last_n_tokens,
        "gguf": None if options.url else options.gguf}),
    dialect=lambda options: DIALECT)
