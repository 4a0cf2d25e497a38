"""The seeds' decoding params (issue 57, item 1) reach the real engines: HF and vLLM offline apply a logit bias, a
bad-words ban, stop token ids and the special-token rule of the text alike; vLLM says it has no n-gram ban; seed 004's
beam example runs from its shipped scenario. One `parity run` of two scenarios serves every test here."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from helpers import SCENARIOS, ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

FORCED = 28  # a token id forced by a +100 bias (SmolLM2's ",")
STOP = 30  # SmolLM2's "." as a stop token id
EOS = 2  # SmolLM2's <|im_end|>


LLAMA_CPP = "  llama.cpp: {engine: llama.cpp}"
LONG_PIECE = 24112  # "\n" and 37 spaces: 38 bytes, more than llama-cpp-python's 32-byte detokenize buffer
VARIANTS: dict[str, dict] = {  # scenario name -> params beside greedy decoding
    "bias": {"logit_bias": {FORCED: 100.0}},
    "long-piece": {"logit_bias": {LONG_PIECE: 100.0}, "max_new_tokens": 3},
    "bad-words": {"bad_words": ["Paris", " the"], "stop_token_ids": [STOP]},
    "ngram": {"no_repeat_ngram_size": 2, "max_new_tokens": 24},
    "raw-text": {"skip_special_tokens": False, "max_new_tokens": 24},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, ParityRun]:
    """scenario name -> its run: the variants and seed 004's beams, in one command (one load per engine)."""
    tmp = tmp_path_factory.mktemp("decoding-params")
    files = [write_scenario(tmp / f"{name}.yaml", f"""\
name: {name}
model: smollm2-135m
dtype: float32
engines:
  hf: {{engine: hf, reference: true}}
  vllm: {{engine: vllm}}
{LLAMA_CPP if name == "long-piece" else ""}
prompts:
  - id: capital
    text: "The capital of France is"
  - id: chat
    messages: [{{role: user, content: "What is 2+2? Answer with one word."}}]
params: {json.dumps({"temperature": 0, "max_new_tokens": 16, **params})}
""") for name, params in VARIANTS.items()]
    run = parity("run", *map(str, files), str(SCENARIOS / "seed004-beams.yaml"), out=tmp / "out")
    assert run.code in (0, 1), run.stderr[-2000:]
    found = {}
    for run_dir in sorted((tmp / "out").iterdir()):
        name = json.loads((run_dir / "run.json").read_text())["scenario_name"]
        found[name] = ParityRun(run.code, run.stdout, run.stderr, run_dir)
    return found


def test_a_forcing_bias_is_applied_by_both_engines(runs: dict[str, ParityRun]) -> None:
    results = runs["bias"].results
    for ids in results.token_ids:
        assert list(ids) == [FORCED] * 16
    assert runs["bias"].verdicts.expected.all()


def test_a_token_longer_than_llama_cpp_pythons_buffer_vanishes_from_its_text(runs: dict[str, ParityRun]) -> None:
    """llama-cpp-python 0.3.36's detokenize gives llama_token_to_piece 32 bytes and slices by its negative "too small"
    answer, so a longer piece is dropped (llama-cpp-python#2362): the ids match, the text verdicts name it."""
    tokens = runs["long-piece"].verdicts.set_index("engine")
    assert set(tokens.loc[["vllm", "llama.cpp"]].verdict) == {"match"}
    text = pd.read_parquet(runs["long-piece"].run_dir / "text.parquet").set_index(["engine", "case_id"])
    assert text.loc[("vllm", "capital")].expected and text.loc[("hf", "capital")].text == ("\n" + " " * 37) * 3
    dropped = text.loc[("llama.cpp", "capital")]
    assert not dropped.expected and dropped.text == "" and dropped.text_check == "differs"
    assert dropped.explanation.startswith("detokeniser: the text leaves the decoding of its own ids at character 0")


def test_bad_words_never_appear_and_a_stop_token_id_ends_the_text(runs: dict[str, ParityRun]) -> None:
    results = runs["bad-words"].results
    for _, row in results.iterrows():
        assert "Paris" not in row.text and " the" not in row.text, (row.engine, row.text)
        ids = list(row.token_ids)
        assert STOP not in ids[:-1] and (row.finish_reason == "stop") == (ids[-1] in (STOP, EOS))
    assert STOP in {ids[-1] for ids in results.token_ids}
    assert runs["bad-words"].verdicts.expected.all()
    assert all(json.loads(e)["stop_token_ids"] == [STOP] for e in results.effective)


def test_the_ngram_ban_is_hfs_alone_and_vllm_says_so(runs: dict[str, ParityRun]) -> None:
    results = runs["ngram"].results.set_index(["case_id", "engine"])
    for (case, engine), row in results.iterrows():
        ids = list(row.token_ids)
        pairs = list(zip(ids, ids[1:]))
        if engine == "hf":
            assert len(pairs) == len(set(pairs)), f"hf repeated a 2-gram in {case}"
        else:
            assert any("no_repeat_ngram_size=2 NOT APPLIED: vLLM has no n-gram ban" in w for w in row.warnings)


def test_special_tokens_stay_in_the_text_when_asked_except_vllms_stop_token(runs: dict[str, ParityRun]) -> None:
    """HF's decode keeps the EOS that ended the answer; vLLM's detokeniser leaves a stop token's text out unless
    include_stop_str_in_output is set, and `parity params` names that difference."""
    results = runs["raw-text"].results
    chat = results[results.case_id == "chat"].set_index("engine")
    assert set(chat.finish_reason) == {"stop"} and list(chat.token_ids["hf"])[-1] == EOS
    assert chat.text["hf"].endswith("<|im_end|>") and not chat.text["vllm"].endswith("<|im_end|>")
    assert chat.text["hf"].removesuffix("<|im_end|>") == chat.text["vllm"]
    assert any("include_stop_str_in_output: hf True, vllm False" in text
               for _, text in runs["raw-text"].meta["effective_differences"])


def test_seed_004s_beam_example_runs_from_its_scenario(runs: dict[str, ParityRun]) -> None:
    run = runs["seed004-beams"]
    beams = pd.read_parquet(run.run_dir / "beams.parquet")
    assert sorted(beams.groupby("engine").size().items()) == [("hf", 3), ("vllm", 3)]
    for ids in beams[beams.engine == "hf"].token_ids:
        pairs = list(zip(ids, ids[1:]))
        assert len(pairs) == len(set(pairs))  # HF applied no_repeat_ngram_size 2 to every returned beam
    warnings = " ".join(w for ws in run.results.warnings for w in ws)
    assert "early_stopping=True NOT APPLIED" in warnings and "no_repeat_ngram_size=2 NOT APPLIED" in warnings
    assert any("no_repeat_ngram_size: hf 2, vllm n/a" in text for _, text in run.meta["effective_differences"])


@pytest.fixture(scope="module")
def constrained(tmp_path_factory) -> ParityRun:
    """The shipped constrained-output scenario on vLLM offline and llama.cpp (its server engine is covered by
    `parity params`, which builds the server's request through vLLM's own request model)."""
    tmp = tmp_path_factory.mktemp("constrained")
    return parity("run", str(SCENARIOS / "constrained.yaml"), "--engines", "hf,vllm,llama.cpp", out=tmp / "out")


def test_constrained_output_gets_the_metamorphic_verdicts(constrained: ParityRun) -> None:
    assert constrained.code == 0, constrained.stdout[-3000:]
    rows = pd.read_parquet(constrained.run_dir / "constraint.parquet").set_index(["engine", "case_id"])
    for engine in ("vllm", "llama.cpp"):
        people, capital = rows.loc[(engine, "people")], rows.loc[(engine, "capital")]
        assert people.verdict == "unchanged" and people.reference_satisfies, people.explanation
        assert capital.verdict == "steered" and capital.masked_step == 0 and capital.engine_satisfies
        assert json.loads(capital.text)["name"]  # the schema's required fields are there
    tokens = constrained.verdicts.set_index(["engine", "case_id"])
    assert tokens.loc[("vllm", "capital")].verdict == "diverged" and tokens.loc[("vllm", "capital")].expected


def test_params_show_which_engines_constrain(tmp_path) -> None:
    run = parity("params", str(SCENARIOS / "constrained.yaml"))
    assert run.code == 0, run.stderr[-2000:]
    row = next(line for line in run.stdout.splitlines() if line.startswith("| constraint |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "-" and all(c.startswith("json_schema {") for c in cells[2:5]), cells
