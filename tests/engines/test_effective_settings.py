"""`parity params` shows every setting that changes the tokens, not only the canonical params: each token-changing
field of a model's generation_config.json, per engine, as applied (with the value), not applied, or unknown (a
server whose sampling code is not installed here), computed by each engine's own code."""

from __future__ import annotations

import json

import pytest

from harness import models

from helpers import ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

FIELDS = {"no_repeat_ngram_size": 3, "suppress_tokens": [5, 6], "bad_words_ids": [[7]], "eos_token_id": [2, 9],
          "typical_p": 0.9, "not_a_generation_setting": 1}


@pytest.fixture(scope="module")
def params_run(tmp_path_factory) -> ParityRun:
    tmp = tmp_path_factory.mktemp("settings")
    folder = tmp / "model"
    folder.mkdir()
    source = models.resolve("tiny-llama", "float32")
    for item in source.iterdir():
        if item.name != "generation_config.json":
            (folder / item.name).symlink_to(item)
    config = json.loads((source / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, **FIELDS}))
    scenario = write_scenario(tmp / "s.yaml", f"""\
model: {folder}
engines:
  hf: {{engine: hf, reference: true}}
  vllm: {{engine: vllm}}
  server: {{engine: vllm-server, options: {{generation_config: auto}}}}
  lmdeploy: {{engine: lmdeploy, dtype: float16}}
  other: {{engine: openai, options: {{url: "http://127.0.0.1:9/v1", dialect: generic}}}}
prompts: ["x"]
params: {{temperature: 0, max_new_tokens: 8}}
""")
    return parity("params", str(scenario), "--all")


def rows(run: ParityRun) -> dict[str, list[str]]:
    table = {}
    for line in run.stdout.splitlines():
        if line.startswith("| ") and not line.startswith("| param "):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            table[cells[0]] = cells[1:]
    return table


def test_every_token_changing_field_is_listed_per_engine(params_run: ParityRun) -> None:
    assert params_run.code == 0, params_run.stderr[-2000:]
    table = rows(params_run)  # engines: hf, vllm, server, lmdeploy, other; then DIFFERS
    # a canonical param the file sets: HF takes it from there, no other engine has an n-gram ban
    assert table["no_repeat_ngram_size"] == ["3", "-", "-", "-", "-", "DIFFERS"]
    eos = table["eos_token_id (generation_config.json: eos_token_id)"]
    assert eos[:4] == ["applies 2 > 9"] * 4 and eos[4] == "unknown (the server decides)"
    unknown = table["not_a_generation_setting (generation_config.json: not_a_generation_setting)"]
    assert unknown[0] == "not applied"  # HF keeps a field it does not know, and never uses it
    for field in ("suppress_tokens", "bad_words_ids"):
        assert table[f"{field} (generation_config.json: {field})"][:2] == [
            f"applies {' > '.join(map(str, FIELDS[field]))}", "not applied"], field
    # a sampling flag while decoding greedily: HF warns and ignores it, as every engine here does
    assert table["typical_p (generation_config.json: typical_p)"][:2] == ["not applied", "not applied"]


def test_processors_and_the_servers_unknowns_are_named(params_run: ParityRun) -> None:
    text = " ".join(params_run.stdout.split())
    assert "NoRepeatNGramLogitsProcessor" in text and "SuppressTokensLogitsProcessor" in text
    assert "the generic server's sampling code is not installed here" in text
