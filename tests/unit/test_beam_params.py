"""Beam-search params: the vocabulary's rules, validation of engines without beam search (exit 2, or skipped with
--allow-missing), and what each adapter sends for them and warns about. No engine runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.engines.hf import translate as hf_translate
from adapters.engines.vllm_offline import translate as vllm_translate
from adapters.http.beam_requests import translate as server_translate
from adapters.http.dialects import DIALECTS, markdown_table
from harness.core.errors import ConfigError
from harness.core.types import BEAM_EFFECTIVE, COMPARED
from harness.core.vocabulary import BEAM, BEAM_OPTIONS, GREEDY_IRRELEVANT, Group, SamplingParams, names
from harness.plan.plans import unavailable_engines
from harness.scenario.spec import load

from helpers import parity_in_process, write_scenario

BEAMS = SamplingParams(temperature=0, max_new_tokens=8, num_beams=4)

WITH_LMDEPLOY = """\
model: tiny-llama
dtype: bfloat16
engines:
  hf: {engine: hf, reference: true}
  vllm: {engine: vllm}
  lmdeploy: {engine: lmdeploy}
prompts: ["hi"]
params:
  max_new_tokens: 4
  num_beams: 2
"""


def test_beam_params_are_one_group_of_the_vocabulary() -> None:
    assert BEAM == names(Group.BEAM) == ("num_beams", "length_penalty", "early_stopping", "num_return_sequences")
    assert set(BEAM_OPTIONS) == set(BEAM) - {"num_beams"}
    assert not set(BEAM) & set(GREEDY_IRRELEVANT)  # beam search is greedy: its params matter there
    assert set(BEAM) <= set(BEAM_EFFECTIVE) <= set(COMPARED)
    assert BEAMS.greedy and BEAMS.beams_returned == 4
    assert SamplingParams(num_beams=4, num_return_sequences=2).beams_returned == 2
    assert SamplingParams().beams_returned == 0


@pytest.mark.parametrize("params, words", [
    ({"length_penalty": 1.0}, "length_penalty: for beam search only: set num_beams too"),
    ({"num_beams": 4, "temperature": 0.7}, "beam sampling) is not compared"),
    ({"num_beams": 4, "do_sample": True, "temperature": 1.0}, "beam sampling) is not compared"),
    ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences 3 exceeds num_beams 2"),
    ({"num_beams": 1}, "greater than or equal to 2"),
    ({"num_beams": 2, "early_stopping": "sometimes"}, "early_stopping"),
])
def test_contradictory_beam_params_are_rejected(params, words) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        SamplingParams(**params)


def test_an_engine_without_beam_search_fails_validation_with_the_reason(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "beams.yaml", WITH_LMDEPLOY)
    run = parity_in_process("validate", str(path))
    assert run.code == 2, run.stdout
    assert run.stderr.startswith(f"error: {path}:10: params.num_beams: engine lmdeploy (lmdeploy) has no beam search")
    assert "--allow-missing" in run.stderr and "(hf, vllm, vllm-server, openai)" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("dialect, refused", [("vllm", False), ("generic", True), ("lmdeploy", True),
                                              ("llamacpp", True)])
def test_an_attached_server_searches_beams_only_through_the_vllm_dialect(tmp_path: Path, dialect: str,
                                                                          refused: bool) -> None:
    text = WITH_LMDEPLOY.replace("{engine: lmdeploy}", "{engine: openai, options: {url: 'http://127.0.0.1:9', "
                                 f"dialect: {dialect}}}}}").replace("lmdeploy:", "server:")
    run = parity_in_process("validate", str(write_scenario(tmp_path / "beams.yaml", text)))
    assert run.code == (2 if refused else 0), run.stderr
    if refused:
        assert f"engine server (openai) cannot search beams through the {dialect} dialect: the only server with a " \
               "beam-search request is vLLM's (dialect: vllm)" in run.stderr


def test_run_refuses_it_before_any_engine_starts_or_skips_it_with_allow_missing(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "beams.yaml", WITH_LMDEPLOY.replace("dtype: bfloat16\n", ""))
    path.write_text(path.read_text().replace("{engine: lmdeploy}", "{engine: lmdeploy, dtype: bfloat16}"))
    run = parity_in_process("run", str(path), "--out", str(tmp_path / "reports"))
    assert run.code == 2 and "has no beam search" in run.stderr
    assert not (tmp_path / "reports").exists()  # nothing started
    scenario = load(path)
    skipped = unavailable_engines(scenario, ["hf", "vllm", "lmdeploy"], allow_missing=True)
    assert set(skipped) == {"lmdeploy"} and "has no beam search" in skipped["lmdeploy"]
    with pytest.raises(ConfigError, match="has no beam search"):
        unavailable_engines(scenario, ["hf", "lmdeploy"], allow_missing=False)


def test_an_engine_without_beam_search_still_runs_the_scenarios_other_cases(tmp_path: Path) -> None:
    text = WITH_LMDEPLOY.replace("  num_beams: 2\n", "grid: {num_beams: [null, 2]}\n")
    scenario = load(write_scenario(tmp_path / "mixed.yaml", text))
    greedy, beams = (c.case_id for c in scenario.cases)
    assert "lmdeploy" in scenario.incapable and "case(s) p0[num_beams=2] ask for it" in scenario.incapable["lmdeploy"]
    assert scenario.with_cases([greedy]).incapable == {}
    assert set(scenario.with_cases([beams]).incapable) == {"lmdeploy"}


def test_a_case_searches_beams_in_every_engine_or_in_none(tmp_path: Path) -> None:
    text = WITH_LMDEPLOY.replace("  lmdeploy: {engine: lmdeploy}\n", "").replace("  num_beams: 2\n", "").replace(
        "vllm: {engine: vllm}", "vllm: {engine: vllm, params: {num_beams: 2}}")
    with pytest.raises(ConfigError, match=r"beams.yaml:5: engines.vllm.params.num_beams: case p0: engine hf does "
                                          "not search beams where the others do"):
        load(write_scenario(tmp_path / "beams.yaml", text))


def test_hf_sends_its_own_beam_kwargs_and_leaves_unset_ones_to_its_generation_config() -> None:
    native = hf_translate(BEAMS).native_params
    assert native["num_beams"] == 4 and native["num_return_sequences"] == 4 and native["do_sample"] is False
    assert "length_penalty" not in native and "early_stopping" not in native
    set_all = SamplingParams(temperature=0, num_beams=4, length_penalty=0.0, early_stopping="never",
                             num_return_sequences=2)
    native = hf_translate(set_all).native_params
    assert (native["length_penalty"], native["early_stopping"], native["num_return_sequences"]) == (0.0, "never", 2)


def test_vllm_offline_sends_beam_search_params_and_warns_for_what_its_search_ignores() -> None:
    params = SamplingParams(temperature=0, max_new_tokens=8, num_beams=4, length_penalty=2.0, early_stopping=True,
                            num_return_sequences=2, repetition_penalty=1.2)
    translation = vllm_translate(params)
    assert translation.native_params == {"beam_width": 4, "max_tokens": 8, "ignore_eos": False,
                                         "length_penalty": 2.0, "temperature": 0.0}
    warned = {w.split("=")[0]: w for w in translation.warnings}
    assert set(warned) == {"early_stopping", "num_return_sequences", "repetition_penalty"}
    assert "NOT APPLIED: vLLM's beam search has no early stopping" in warned["early_stopping"]
    assert "the comparison uses the best 2" in warned["num_return_sequences"]
    assert vllm_translate(BEAMS).warnings == []


def test_the_vllm_server_takes_n_as_the_beam_width() -> None:
    params = SamplingParams(temperature=0, max_new_tokens=8, num_beams=4, length_penalty=0.5, early_stopping=False)
    translation = server_translate(params, DIALECTS["vllm"], 5)
    body = translation.native_params
    assert body["use_beam_search"] is True and body["n"] == 4 and body["length_penalty"] == 0.5
    assert body["max_tokens"] == 8 and body["include_stop_str_in_output"] is True and body["logprobs"] == 5
    assert body["return_token_ids"] is True and "early_stopping" not in body
    assert translation.warnings == ["early_stopping=False NOT APPLIED by the vllm server's beam search: no early "
                                    "stopping: it runs to max_tokens"]


def test_dialect_table_shows_who_has_beam_search() -> None:
    table = markdown_table()
    assert "| num_beams | honours (`n`); with use_beam_search: true | no beam search |" in table
    assert "| early_stopping | rejects: not sent (warning); no early stopping: it runs to max_tokens |" in table
    assert DIALECTS["vllm"].handling("num_return_sequences") == "rejects"
    assert DIALECTS["lmdeploy"].handling("num_beams") == "rejects"


def test_params_table_shows_every_beam_setting_of_a_beam_case_and_marks_the_differing_ones() -> None:
    from harness.core.types import Effective
    from harness.semantics.effective import table_rows

    hf = Effective(decoding="beam search", num_beams=4, length_penalty=1.0, early_stopping="false: heuristic",
                   num_return_sequences=4, beam_length="generated", beam_candidates="top num_beams")
    vllm = hf.model_copy(update={"early_stopping": "none", "beam_length": "prompt + generated"})
    rows = {field: (values, differs) for field, values, differs in table_rows({"hf": hf, "vllm": vllm}, False)}
    assert set(BEAM_EFFECTIVE) <= set(rows)
    assert rows["num_beams"] == (["4", "4"], False) and rows["length_penalty"] == (["1", "1"], False)
    assert rows["beam_length"][1] and rows["early_stopping"][1] and not rows["beam_candidates"][1]


def test_transplant_refuses_beam_cases_and_points_to_explain(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "beams.yaml", WITH_LMDEPLOY.replace("  lmdeploy: {engine: lmdeploy}\n", ""))
    run = parity_in_process("transplant", str(path), "--out", str(tmp_path / "reports"))
    assert run.code == 2 and "decode by beam search, which transplant does not compare" in run.stderr
    assert "use `parity explain` for beams" in run.stderr and not (tmp_path / "reports").exists()
