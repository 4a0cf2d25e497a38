"""The ground every GGUF file written here for llama.cpp stands on: the one writer setup (a model's f32/f16 file and a
LoRA adapter's file alike), gguf's own tensor-name map, the hyperparameters' shape and the one-line refusal of a
config llama.cpp would compute differently."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    import gguf

Hparams = dict[str, int | float | str | list[bool]]  # GGUFWriter setter name (add_<key>) -> value


@contextmanager
def gguf_file(out: Path, gguf_arch: str) -> Iterator[gguf.GGUFWriter]:
    """A GGUF writer for the llama.cpp architecture `gguf_arch` (a gguf.MODEL_ARCH member: LLAMA, GEMMA3, ...) into
    `out`; what the body adds (keys, tensors) is written to the file when it ends."""
    import gguf

    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, gguf_arch)])
    yield writer
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_name(hf_name: str, n_layers: int, arch: str = "LLAMA") -> str | None:
    """model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight (gguf's own tensor-name map for the
    gguf.MODEL_ARCH member `arch`); None if unknown."""
    import gguf

    mapping = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch), n_layers)
    return mapping.get_name(hf_name, try_suffixes=(".weight", ".bias"))


def require(holds: bool, config: dict, why: str) -> None:
    if not holds:
        refuse(config, why)


def refuse(config: dict, why: str) -> NoReturn:
    """One line saying why the config's model cannot be written for llama.cpp."""
    raise RuntimeError(f"gguf: cannot write model type '{config.get('model_type')}': {why}; give the engine a GGUF "
                       "file (option gguf: PATH)")
