"""llama-cpp-python's server with llama.cpp's extra weight buffers set as the scenario says:
`python -m adapters.engines.llamacpp_serve on|off ARGS...` runs `python -m llama_cpp.server ARGS...` with
llama_model_params.use_extra_bufts on or off. llama_cpp.server (0.3.36) has no setting for them, and llama.cpp's
default (on) crashes a quantised model with SIGSEGV on a CPU whose build uses AMX (see the llama.cpp engine's
extra_buffers option), so the server needs the same switch as the in-process engine."""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    import llama_cpp

    from adapters.engines.llamacpp import model_params

    setting = sys.argv.pop(1)
    if setting not in ("on", "off"):
        raise SystemExit(f"extra buffers: 'on' or 'off', not {setting!r}")
    sys.argv[0] = "llama_cpp.server"
    with model_params(llama_cpp, use_extra_bufts=setting == "on"):
        runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
