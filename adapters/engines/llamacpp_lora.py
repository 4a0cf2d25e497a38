"""A PEFT LoRA adapter as llama.cpp takes it: a GGUF adapter file (general.type adapter, adapter.type lora,
adapter.lora.alpha) holding per adapted weight `<gguf name>.lora_a` (A, [r, in]) and `.lora_b` (B, [out, r]), B's rows
in the base GGUF's layout (a Llama's q and k rows permuted into llama.cpp's rope layout, as the base weights are),
written once beside the model's GGUF variants. llama.cpp scales by alpha / r; an rsLoRA adapter (alpha / sqrt(r)) is
written with alpha x sqrt(r), so llama.cpp applies the scale the adapter means."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from adapters.contract import LoraRules
from adapters.engines.gguf_architectures import stored, writer_for
from adapters.engines.gguf_cache import atomic_write, cache_dir, locked
from adapters.engines.gguf_writer import gguf_file, gguf_name
from harness.models import lora
from harness.models.lora import fingerprint

RULES = LoraRules(source="llama.cpp's LoRA adapters (a GGUF adapter written here from the PEFT folder: A and B of "
                         "the projections, no bias)",
                  modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), bias=False)


def adapter_gguf(model_path: Path, adapter: Path) -> Path:
    """The adapter's GGUF for this model (built once)."""
    digest = hashlib.sha1(fingerprint(adapter).encode()).hexdigest()[:10]
    path = cache_dir(model_path) / f"lora-{adapter.name}-{digest}.gguf"
    with locked(path.parent):
        if not path.exists():
            atomic_write(path, lambda tmp: write_adapter(model_path, adapter, tmp))
    return path


def write_adapter(model_path: Path, adapter: Path, out: Path) -> None:
    import gguf

    config = json.loads((model_path / "config.json").read_text())
    arch = writer_for(config)
    hparams = arch.hparams(config)
    info = lora.read(adapter)
    with gguf_file(out, arch.gguf_arch) as writer:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, info.scale * info.rank)  # llama.cpp scales by alpha / r
        for module, update in sorted(lora.updates(adapter).items()):
            name = gguf_name(f"{module}.weight", config["num_hidden_layers"], arch.gguf_arch)
            if name is None or update.embedding or update.bias is not None:  # the preflight refused these (RULES)
                raise RuntimeError(f"gguf: the adapter's {module} is not a projection llama.cpp's adapter holds "
                                   f"({RULES.source})")
            writer.add_tensor(f"{name}.lora_a", np.ascontiguousarray(update.a.astype(np.float32)))
            # B's rows are the weight's output rows: laid out as the base weight is
            writer.add_tensor(f"{name}.lora_b", np.ascontiguousarray(stored(update.b, name, arch, hparams, "f32")))
