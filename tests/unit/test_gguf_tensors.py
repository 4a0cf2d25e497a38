"""A GGUF file's real tensor types and metadata values, read from its header (adapters.engines.gguf_tensors,
harness.models.gguf_header), against gguf's own reader on a file written here with every kind of metadata value; and
the quantiser log's fallbacks in words. No engine runs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from adapters.engines.gguf_tensors import describe, fallbacks, tensor_types
from harness.models.gguf_header import metadata, read

LOG = """\
warning: blk.0.attn_k.weight - ncols    576 not divisible by 256 (required for type    q4_K) -> falling back to    q5_0
warning: blk.0.attn_v.weight - ncols    576 not divisible by 256 (required for type    q6_K) -> falling back to    q8_0
llama_model_quantize_impl: WARNING: 180 of 272 tensor(s) required fallback quantization
"""


def write_gguf(path: Path) -> Path:
    writer = GGUFWriter(str(path), "llama")
    writer.add_uint32("test.u32", 7)
    writer.add_float64("test.f64", 0.5)
    writer.add_bool("test.bool", True)
    writer.add_string("test.string", "a string")
    writer.add_array("tokenizer.ggml.tokens", [f"token{i}" for i in range(300)])  # strings: skipped one by one
    writer.add_array("tokenizer.ggml.scores", [float(i) for i in range(300)])
    writer.add_tensor("token_embd.weight", np.zeros((64, 96), dtype=np.float16))
    writer.add_tensor("output_norm.weight", np.ones(96, dtype=np.float32))
    q8 = np.zeros((32, 34 * 96 // 32), dtype=np.uint8)  # Q8_0: 34 bytes per block of 32 values; raw_shape is in bytes
    writer.add_tensor("blk.0.ffn_up.weight", q8, raw_shape=(32, 34 * 3), raw_dtype=GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_header_reader_counts_what_ggufs_own_reader_does(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "mixed.gguf")
    expected: Counter[str] = Counter()
    for tensor in GGUFReader(str(path)).tensors:
        expected[tensor.tensor_type.name] += int(tensor.n_elements)
    assert tensor_types(path) == expected == Counter({"F16": 64 * 96, "Q8_0": 32 * 96, "F32": 96})
    assert describe(path) == "F16 66.0%, Q8_0 33.0%, F32 1.0% of 9,312 weights"


def test_metadata_values_are_those_of_ggufs_own_reader(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "mixed.gguf")
    fields = {key: field for key, field in GGUFReader(str(path)).fields.items() if not key.startswith("GGUF.")}
    assert len(fields) == 7  # GGUF.* are the reader's own: version and counts from the file's first bytes
    assert metadata(path, tuple(fields)) == {key: field.contents() for key, field in fields.items()}
    assert metadata(path, ("test.bool", "test.u32", "absent")) == {"test.bool": True, "test.u32": 7}
    values, tensors = read(path)
    assert {key: list(value.types) for key, value in values.items()} == {key: f.types for key, f in fields.items()}
    assert [tuple(t) for t in tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset))
        for t in GGUFReader(str(path)).tensors]


def test_the_quantisers_fallbacks_in_words(tmp_path: Path) -> None:
    (tmp_path / "q4_k_m.quantize.log").write_text(LOG)
    assert fallbacks(tmp_path / "q4_k_m.quantize.log") == (
        "180 of 272 tensors fell back (q4_K -> q5_0 and q6_K -> q8_0): their rows are 576 wide, not a multiple of 256")
    assert fallbacks(tmp_path / "missing.log") == ""
    (tmp_path / "clean.log").write_text("llama_model_quantize_impl: quant size  =    98.87 MiB\n")
    assert fallbacks(tmp_path / "clean.log") == ""
