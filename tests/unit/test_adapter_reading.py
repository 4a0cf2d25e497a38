"""The LoRA update comparison of harness.explain.adapter_reading on hand-written norms: equal updates agree, a module
one engine leaves out or adds is named, a common factor is a scale (rsLoRA's sqrt(r) named), another layer's updates
a layer shift (never modules with nothing in common), anything else other weights."""

from __future__ import annotations

import json
import math

from harness.explain.adapter_reading import compare, norms, tolerance

REFERENCE = {(0, "q_proj"): 1.0, (0, "v_proj"): 2.0, (1, "q_proj"): 3.0, (1, "v_proj"): 4.0, (2, "q_proj"): 5.0,
             (2, "v_proj"): 6.0}


def test_norms_are_read_from_a_traces_metadata() -> None:
    assert norms({"engine": "hf"}) is None
    assert norms({"lora_norms": json.dumps({"0.q_proj": 1.5})}) == {(0, "q_proj"): 1.5}


def test_equal_updates_agree() -> None:
    found = compare(REFERENCE, {k: v * (1 + 1e-6) for k, v in REFERENCE.items()}, 8, "vllm")
    assert found["kind"] == "same" and "all 6 adapted modules" in found["sentence"]


def test_a_module_left_out_is_named_with_its_layers() -> None:
    other = {k: v for k, v in REFERENCE.items() if k[1] != "v_proj"}
    found = compare(REFERENCE, other, 8, "x")
    assert found["kind"] == "unadapted" and found["modules"] == ["v_proj"]
    assert "x leaves v_proj unadapted (layers 0..2)" in found["sentence"]


def test_a_common_factor_is_a_scale_and_sqrt_r_is_rslora() -> None:
    found = compare(REFERENCE, {k: v * math.sqrt(8) for k, v in REFERENCE.items()}, 8, "x")
    assert found["kind"] == "scale" and "alpha / sqrt(r) (rsLoRA) where the adapter says alpha / r" in found["sentence"]
    found = compare(REFERENCE, {k: v * 0.5 for k, v in REFERENCE.items()}, 8, "x")
    assert found["kind"] == "scale" and "0.5x the reference's scale" in found["sentence"]
    assert "rsLoRA" not in found["sentence"]


def test_another_layers_updates_are_a_layer_shift() -> None:
    shifted = {(layer, m): REFERENCE[((layer + 1) % 3, m)] for layer, m in REFERENCE}
    found = compare(REFERENCE, shifted, 8, "x")
    assert (found["kind"], found["offset"]) == ("layer_shift", 1)
    assert "layer i holds layer i+1's" in found["sentence"]


def test_unrelated_weights_are_named_where_they_first_differ() -> None:
    other = {**REFERENCE, (1, "v_proj"): 4.5}
    found = compare(REFERENCE, other, 8, "x")
    assert found["kind"] == "weights" and "layer 1 v_proj" in found["sentence"]


def test_half_precision_updates_agree_within_its_tolerance_and_a_zero_update_needs_no_entry() -> None:
    rounded = {k: v * (1 + 3e-3) for k, v in REFERENCE.items()}
    assert compare(REFERENCE, rounded, 8, "x")["kind"] == "scale"  # float32: 3e-3 apart is a scale
    assert compare(REFERENCE, rounded, 8, "x", tolerance("float32", "bfloat16"))["kind"] == "same"
    assert compare({**REFERENCE, (0, "o_proj"): 0.0}, REFERENCE, 8, "x")["kind"] == "same"


def test_an_off_by_one_index_that_leaves_the_last_layer_bare_is_a_layer_shift_not_a_missing_module() -> None:
    shifted = {(layer, m): REFERENCE[(layer + 1, m)] for layer, m in REFERENCE if layer < 2}
    found = compare(REFERENCE, shifted, 8, "x")
    assert (found["kind"], found["offset"]) == ("layer_shift", 1), found


def test_an_engine_that_adapts_modules_the_reference_does_not_is_named_not_same() -> None:
    """Issue 75 item 4: the reference's modules alone were compared, so extra ones read as the same updates."""
    found = compare(REFERENCE, {**REFERENCE, (0, "o_proj"): 0.7, (2, "o_proj"): 0.9}, 8, "x")
    assert found["kind"] == "extra" and "x adapts o_proj, which the reference does not" in found["sentence"]


def test_module_names_with_nothing_in_common_are_not_a_layer_shift() -> None:
    """Issue 75 item 4: the wrap-around search compared nothing (all() of no pairs) and called it a shift of 1."""
    renamed = {(layer, "qkv_proj"): value for (layer, _), value in REFERENCE.items()}
    found = compare(REFERENCE, renamed, 8, "x")
    assert found["kind"] == "unadapted" and found["modules"] == ["q_proj", "v_proj"], found
