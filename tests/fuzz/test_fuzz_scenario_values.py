"""Property-based fuzzing of the values a scenario carries or points at, beyond its own keys: a LoRA adapter folder
(`lora:` and a merged `<model>+<adapter>`: its adapter_config.json, its weights file, each tensor's name, shape and
type), a model folder's config.json (the rope settings and the mixture-of-experts fields) and a `constraint:` block
(JSON schemas, regexes, choices written as YAML 1.1 booleans or numbers).

Each example is built from a usable one by a change whose effect is known: a usable value must validate (exit 0),
an odd one must be a one-line error (exit 2) naming the scenario, the file it is in and its key; a value of any other
kind (random JSON) must end either way, never with a traceback. `parity validate` runs in-process; no engine starts."""

from __future__ import annotations

import copy
import itertools
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import save_file

from harness import models

from fuzzing import NOWHERE, fuzz_settings, validated

EXAMPLES = {"lora": 300, "config": 300, "constraint": 300}
NUMBERED = itertools.count()  # file names: hypothesis seeds `random` alike on every replay of an example
ENGINES = {"ref": {"engine": "hf", "reference": True, "python": NOWHERE},
           "other": {"engine": "vllm", "python": NOWHERE}}
ADAPTER_CONFIG = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"],
                  "base_model_name_or_path": "tiny-llama", "use_rslora": False, "bias": "none"}
ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                   lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children,
                                                                                     max_size=3), max_leaves=6)
NOT_A_NUMBER = st.sampled_from(["1", "x", True, False, [], {}, [1.0], {"a": 1}])
NOT_AN_INT = NOT_A_NUMBER | st.sampled_from([1.5, 2.0, float("nan")])


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="parity-fuzz-values-") as tmp:
        yield Path(tmp)


@pytest.fixture(scope="module")
def base() -> Path:
    """tiny-llama's float32 folder: the base every fuzzed adapter adapts, and the model whose config is fuzzed."""
    if not models.MODELS["tiny-llama"].prepared():
        models.prepare("tiny-llama")
    return models.MODELS["tiny-llama"].folder("float32")


def _scenario(workdir: Path, data: dict[str, Any] | str) -> Path:
    path = workdir / f"s{next(NUMBERED)}.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def _base_scenario(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny-llama", "engines": copy.deepcopy(ENGINES), "prompts": ["hello"],
            "params": {"temperature": 0, "max_new_tokens": 4}, **extra}


# --- LoRA adapter folders -----------------------------------------------------------------------------------------

def _adapter_tensors(base: Path) -> dict[str, np.ndarray]:
    """A usable rank-8 adapter of tiny-llama's q_proj and v_proj in both layers, shapes from the base's header."""
    from safetensors import safe_open

    rng = np.random.default_rng(0)
    out = {}
    with safe_open(str(base / "model.safetensors"), "np") as weights:
        shapes = {f"{layer}.{module}": weights.get_slice(f"model.layers.{layer}.self_attn.{module}.weight").get_shape()
                  for layer in (0, 1) for module in ("q_proj", "v_proj")}
    for layer in (0, 1):
        for module in ("q_proj", "v_proj"):
            rows, columns = shapes[f"{layer}.{module}"]
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            out[f"{prefix}.lora_A.weight"] = rng.standard_normal((8, columns), dtype=np.float32)
            out[f"{prefix}.lora_B.weight"] = rng.standard_normal((rows, 8), dtype=np.float32)
    return out


ODD_CONFIG = {  # key -> values the merge and the engines cannot read, and the words the error must name
    "r": st.sampled_from([0, -8, 4, 16, True, 8.0, "8", None, [8]]),
    "lora_alpha": NOT_A_NUMBER | st.sampled_from([0, -16, float("inf"), None]),
    "use_rslora": st.sampled_from(["yes", "true", 1, 0, [], {}]),
    "peft_type": st.sampled_from(["LOHA", "lora", "", 1, None, ["LORA"]]),
    "use_dora": st.just(True), "fan_in_fan_out": st.just(True), "bias": st.sampled_from(["all", "lora_only"]),
    "modules_to_save": st.just(["lm_head"]), "rank_pattern": st.just({"q_proj": 4}),
}
FINE_CONFIG = {
    "lora_alpha": st.floats(0.01, 1e6) | st.integers(1, 10**6), "use_rslora": st.booleans(),
    "base_model_name_or_path": st.text(max_size=30), "target_modules": ANY, "lora_dropout": ANY, "task_type": ANY,
}


@st.composite
def adapter_change(draw) -> tuple[str, Any, list[str] | None]:
    """(kind, detail, the words an error must hold: None when either outcome is fine, [] when it must validate)."""
    kind = draw(st.sampled_from(["odd_config", "fine_config", "any_config", "config_file", "weights_file",
                                 "tensor_shape", "tensor_type", "rename", "no_pairs"]))
    if kind == "odd_config":
        key = draw(st.sampled_from(sorted(ODD_CONFIG)))
        value = draw(ODD_CONFIG[key])
        if key == "r" and type(value) is int and value > 0:  # a rank the weights do not have
            return kind, (key, value), ["adapter_model.safetensors", "lora_A.weight", f"r = {value}"]
        return kind, (key, value), ["adapter_config.json", "r (the rank)" if key == "r" else key]
    if kind == "fine_config":
        key = draw(st.sampled_from(sorted(FINE_CONFIG)))
        return kind, (key, draw(FINE_CONFIG[key])), []
    if kind == "any_config":
        return kind, (draw(st.sampled_from([*ODD_CONFIG, *FINE_CONFIG, "x"])), draw(ANY)), None
    if kind == "config_file":
        return kind, draw(st.sampled_from(["[1]", '"x"', "5", "null", "{", "", "\x80"])), ["adapter_config.json"]
    if kind == "weights_file":
        return kind, draw(st.binary(max_size=64)), ["adapter_model.safetensors"]
    if kind == "tensor_shape":
        shape = draw(st.sampled_from([(), (8,), (1, 8, 64), (4, 64), (64, 4), (16, 64)]))
        return kind, (draw(st.integers(0, 7)), shape), ["adapter_model.safetensors", ".weight"]
    if kind == "tensor_type":
        return kind, (draw(st.integers(0, 7)), draw(st.sampled_from([np.int8, np.int32, np.uint8, np.bool_]))), \
            ["adapter_model.safetensors", ".weight", "floating point"]
    if kind == "rename":
        module = draw(st.sampled_from(["mlp.nope", "self_attn.q_norm", "embed", "self_attn.rotary"]))
        return kind, module, ["tiny-llama does not have"]
    return kind, None, ["adapter_model.safetensors", "is not a LoRA tensor the harness applies"]


def _write_adapter(folder: Path, tensors: dict[str, np.ndarray], change: tuple[str, Any, Any]) -> None:
    kind, detail, _ = change
    folder.mkdir(parents=True)
    config, tensors = dict(ADAPTER_CONFIG), dict(tensors)
    if kind in ("odd_config", "fine_config", "any_config"):
        config[detail[0]] = detail[1]
    names = sorted(tensors)
    if kind == "tensor_shape":
        name = names[detail[0]]
        tensors[name] = np.ones(detail[1], dtype=np.float32)
    elif kind == "tensor_type":
        name = names[detail[0]]
        tensors[name] = tensors[name].astype(detail[1])
    elif kind == "rename":
        tensors = {name.replace("self_attn.v_proj", detail[1]): value for name, value in tensors.items()}
    elif kind == "no_pairs":
        tensors = {name.replace(".lora_", ".other_"): value for name, value in tensors.items()}
    (folder / "adapter_config.json").write_text(detail if kind == "config_file" else json.dumps(config))
    if kind == "weights_file":
        (folder / "adapter_model.safetensors").write_bytes(detail)
    else:
        save_file(tensors, str(folder / "adapter_model.safetensors"))


@fuzz_settings(EXAMPLES["lora"])
@given(change=adapter_change(), merged=st.booleans())
def test_fuzzed_adapter_folders_are_one_line_errors_naming_file_and_key(workdir: Path, base: Path, change,
                                                                         merged: bool) -> None:
    folder = workdir / "adapters" / f"a{next(NUMBERED)}"
    _write_adapter(folder, _adapter_tensors(base), change)
    scenario = _base_scenario(model=f"tiny-llama+{folder}") if merged else _base_scenario(lora=str(folder))
    done = validated(_scenario(workdir, scenario), change[2])
    if done.code == 2:
        assert ("model: " if merged else "lora: ") in done.stderr, done.stderr


def test_the_unfuzzed_adapter_validates_both_ways(workdir: Path, base: Path) -> None:
    folder = workdir / "adapters" / "usable"
    _write_adapter(folder, _adapter_tensors(base), ("none", None, []))
    for scenario in (_base_scenario(lora=str(folder)), _base_scenario(model=f"tiny-llama+{folder}")):
        validated(_scenario(workdir, scenario), [])


# --- a model folder's config.json: rope and mixture-of-experts values ----------------------------------------------

FIELDS = {  # key -> (usable values, odd values)
    "rope_theta": (st.floats(1.0, 1e7), NOT_A_NUMBER | st.sampled_from([0, -1.0, float("inf"), float("nan")])),
    "factor": (st.floats(0.5, 64.0), NOT_A_NUMBER | st.sampled_from([0, -2.0, float("nan")])),
    "original_max_position_embeddings": (st.integers(1, 10**6), NOT_AN_INT | st.sampled_from([0, -4096])),
    "partial_rotary_factor": (st.floats(0.01, 1.0), NOT_A_NUMBER | st.sampled_from([0, 1.5, -0.5])),
    "rope_type": (st.sampled_from(["default", "linear", "dynamic", "yarn", "llama3"]),
                  st.sampled_from(["", 1, True, [], {}])),
    "short_factor": (st.lists(st.floats(0.5, 8.0), min_size=1, max_size=4),
                     st.sampled_from([[], "1", [0.0], [-1.0], ["x"], 1.0])),
}
MOE = {
    "num_experts": (st.integers(0, 64), NOT_AN_INT | st.sampled_from([-1])),
    "num_local_experts": (st.integers(0, 64), NOT_AN_INT | st.sampled_from([-4])),
    "n_routed_experts": (st.integers(0, 64), NOT_AN_INT | st.sampled_from([-4])),
    "num_experts_per_tok": (st.integers(1, 2), NOT_AN_INT | st.sampled_from([0, -2])),
    "moe_intermediate_size": (st.integers(1, 4096), NOT_AN_INT | st.sampled_from([0, -64])),
    "n_group": (st.integers(1, 8), NOT_AN_INT | st.sampled_from([0])),
    "routed_scaling_factor": (st.floats(0.1, 10.0), NOT_A_NUMBER | st.sampled_from([0, -1.0])),
    "norm_topk_prob": (st.booleans(), st.sampled_from(["true", 1, 0, "no", []])),
}


@st.composite
def config_change(draw) -> tuple[dict[str, Any], list[str] | None]:
    """A change to tiny-llama's config.json and the key an error must name ([]: usable, None: either)."""
    kind = draw(st.sampled_from(["rope", "rope_per_layer_type", "top", "moe", "rope_not_an_object", "any"]))
    odd = draw(st.booleans())
    if kind == "any":
        key = draw(st.sampled_from(["rope_parameters", "rope_scaling", "rope_theta", *MOE, "text_config"]))
        return {key: draw(ANY)}, None
    if kind == "rope_not_an_object":
        key = draw(st.sampled_from(["rope_parameters", "rope_scaling"]))
        return {key: draw(st.sampled_from(["yarn", 1.0, [], [{}], True]))}, [key]
    if kind in ("rope", "rope_per_layer_type"):
        field = draw(st.sampled_from(sorted(FIELDS)))
        value = draw(FIELDS[field][odd])
        rope = {"rope_type": "default", "rope_theta": 10000.0, field: value}
        container = draw(st.sampled_from(["rope_parameters", "rope_scaling"]))
        if kind == "rope_per_layer_type":
            return {container: {"full_attention": rope, "sliding_attention": {"rope_type": "default"}}}, \
                [f"{container}.full_attention.{field}"] if odd else []
        return {container: rope}, [f"{container}.{field}"] if odd else []
    if kind == "top":
        field = draw(st.sampled_from(["rope_theta", "partial_rotary_factor"]))
        return {field: draw(FIELDS[field][odd])}, [field] if odd else []
    field = draw(st.sampled_from(sorted(MOE)))
    value = draw(MOE[field][odd])
    change = {field: value}
    if field == "num_experts_per_tok":
        change["num_experts"] = 4
    if not odd and field == "n_group":
        change["topk_group"] = value
    return change, [field] if odd else []


@pytest.fixture(scope="module")
def model_folder(workdir: Path, base: Path) -> Path:
    """A copy of tiny-llama as a user's folder: its files linked, config.json its own to change."""
    folder = workdir / "model"
    folder.mkdir()
    for item in base.iterdir():
        if item.name != "config.json":
            (folder / item.name).symlink_to(item)
    return folder


@fuzz_settings(EXAMPLES["config"])
@given(change=config_change(), text_config=st.booleans())
def test_fuzzed_model_configs_are_one_line_errors_naming_file_and_key(workdir: Path, base: Path, model_folder: Path,
                                                                      change, text_config: bool) -> None:
    values, odd = change
    config = json.loads((base / "config.json").read_text())
    if text_config:  # a multimodal config keeps the language model's settings in text_config
        config["text_config"] = values
        odd = [f"text_config.{key}" for key in odd] if odd else odd
    else:
        config.update(values)
    (model_folder / "config.json").write_text(json.dumps(config, allow_nan=True))
    validated(_scenario(workdir, _base_scenario(model=str(model_folder))),
               [str(model_folder), "config.json", *odd] if odd else odd)


def test_the_unchanged_model_folder_validates(workdir: Path, base: Path, model_folder: Path) -> None:
    (model_folder / "config.json").write_text((base / "config.json").read_text())
    validated(_scenario(workdir, _base_scenario(model=str(model_folder))), [])


# --- constraint: blocks -------------------------------------------------------------------------------------------

BOOLEANS = ("yes", "no", "Yes", "NO", "on", "Off", "true", "False", "TRUE")  # YAML 1.1 reads them as booleans
NUMBERS = ("1", "2.5", "0", "-3")
WORDS = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True).filter(
    lambda w: w.lower() not in ("yes", "no", "on", "off", "true", "false", "null"))


@st.composite
def choices(draw) -> tuple[str, list[str] | None]:
    """A `choice:` list written as a user would, unquoted, and the word an error must quote ([]: all text)."""
    words = draw(st.lists(st.one_of(WORDS, st.sampled_from(BOOLEANS + NUMBERS)), min_size=1, max_size=5))
    first = next((w for w in words if w in BOOLEANS + NUMBERS), None)
    return f"constraint: {{choice: [{', '.join(words)}]}}\n", [f"quote it, '{first}'"] if first else []


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except Exception:  # whatever the standard parser raises: it does not compile
        return False
    return True


@st.composite
def regexes(draw) -> tuple[str, list[str] | None]:
    pattern = draw(st.text(max_size=20) | st.sampled_from(
        ["a{99999999999}", "(" * 2000 + ")" * 2000, "[", "(?P<a>x)(?P<a>y)", "\\", "(?<=a+)b", "[a-\\d]"]))
    block = yaml.safe_dump({"constraint": {"regex": pattern}}, allow_unicode=True, width=10**6)
    return block, [] if _compiles(pattern) else ["constraint", "regex"]


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"$ref": "#/$defs/age"}},
          "required": ["name"], "$defs": {"age": {"type": "integer", "minimum": 0}}}
ODD_SCHEMAS = {  # a change to SCHEMA that no engine could use, and what the error names
    "$ref": (("properties", "age", "$ref"), st.sampled_from(["#/$defs/nope", "http://example.com/s.json", "other.json",
                                                            "#/properties/name/x"])),
    "pattern": (("properties", "name", "pattern"), st.sampled_from(["(", "a{99999999999}", "[z-a]"])),
    "type": (("type",), st.sampled_from(["thing", 5, ["object", 1]])),
    "$schema": (("$schema",), st.sampled_from([5, [], {}])),
    "minimum": (("$defs", "age", "minimum"), st.sampled_from(["0", [], {}])),
}


@st.composite
def schemas(draw) -> tuple[str, list[str] | None]:
    schema = copy.deepcopy(SCHEMA)
    kind = draw(st.sampled_from(["odd", "any", "fine"]))
    if kind == "odd":
        path, values = ODD_SCHEMAS[draw(st.sampled_from(sorted(ODD_SCHEMAS)))]
        node = schema
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = draw(values)
        expected: list[str] | None = ["constraint", "json_schema"]
    elif kind == "any":
        schema[draw(st.sampled_from(["properties", "items", "$defs", "anyOf", "x", "$ref"]))] = draw(ANY)
        expected = None
    else:
        schema["properties"]["extra"] = {"type": draw(st.sampled_from(["string", "number", "boolean", "array"]))}
        expected = []
    return yaml.safe_dump({"constraint": {"json_schema": schema}}, allow_unicode=True), expected


@fuzz_settings(EXAMPLES["constraint"])
@given(block=choices() | regexes() | schemas())
def test_fuzzed_constraints_are_one_line_errors_naming_the_key(workdir: Path, block) -> None:
    text, odd = block
    scenario = yaml.safe_dump(_base_scenario(), sort_keys=False) + text
    validated(_scenario(workdir, scenario), odd)


def test_yaml_booleans_in_choices_are_told_to_be_quoted(workdir: Path) -> None:
    """`choice: [yes, no]` reads as [True, False] (YAML 1.1): the error quotes the word as written."""
    path = _scenario(workdir, yaml.safe_dump(_base_scenario(), sort_keys=False) + "constraint: {choice: [yes, no]}\n")
    validated(path, ["constraint.choice.0", "yes is read as the boolean True", "quote it, 'yes'"])
