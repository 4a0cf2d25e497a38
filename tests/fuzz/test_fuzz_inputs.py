"""Property-based fuzzing of everything the harness reads: scenario files (valid and broken: wrong types, unknown
keys, empty and huge lists, unicode, duplicated ids and keys, YAML anchors and tags, binary garbage, truncation),
command lines, run directories and baselines (truncated, parts missing, another layout, edited by hand).

Every example runs the real CLI in-process (typer's runner) and must end with exit 0 or a documented error exit
(2 config, 3 engine unavailable), with no traceback and, on error, one line that names the file it is about. No
engine starts: scenarios that would run name an interpreter that does not exist, so a run stops at exit 3 after
everything the harness checks before starting engines. Budgets are bounded (EXAMPLES) so the file runs in a few
minutes on 2 cores; the examples are random each run (hypothesis prints the seed of a failure to reproduce it)."""

from __future__ import annotations

import copy
import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from harness.compare.baseline import save as save_baseline
from harness.compare.token_rules import judge
from harness.core.types import Result
from harness.rundir.journal import read_journal
from harness.rundir.store import EngineMeta, RunMeta, RunSelection, write_meta
from harness.rundir.tables import results_frame, steps_frame, write_parquet
from harness.scenario.spec import load

from fuzzing import NOWHERE, OK_CODES, check
from fuzzing import fuzz_settings as examples
from helpers import parity, parity_in_process

EXAMPLES = {"scenario": 300, "raw": 200, "argv": 200, "run_dir": 200, "baseline": 100, "journal": 200,
            "model": 150, "paths": 200}


def fuzz_settings(kind: str):
    return examples(EXAMPLES[kind])


BASE: dict[str, Any] = {
    "name": "s",
    "model": "tiny-llama",
    "engines": {"ref": {"engine": "hf", "reference": True, "python": NOWHERE},
                "other": {"engine": "hf", "params": {"repetition_penalty": 1.1}, "python": NOWHERE}},
    "prompts": ["hello", {"id": "chat", "messages": [{"role": "user", "content": "hi"}]},
                {"id": "ids", "token_ids": [1, 2, 3]}],
    "params": {"temperature": 0, "max_new_tokens": 4},
}

# where a mutation may put a value: every key of BASE and the optional keys a scenario may have
SLOTS = [("name",), ("model",), ("dtype",), ("threads",), ("top_logprobs",), ("description",), ("engines",),
         ("engines", "ref"), ("engines", "ref", "engine"), ("engines", "ref", "reference"), ("engines", "other"),
         ("engines", "other", "options"), ("engines", "other", "options", "url"),
         ("engines", "other", "options", "batched"), ("engines", "other", "params"), ("engines", "other", "dtype"),
         ("engines", "other", "threads"), ("engines", "other", "batch_size"), ("engines", "other", "expect"),
         ("engines", "other", "timeouts"), ("engines", "third"), ("prompts",), ("prompts", 0), ("prompts", 1),
         ("prompts", 1, "id"), ("prompts", 1, "messages"), ("prompts", 2, "token_ids"), ("params",),
         ("params", "temperature"), ("params", "max_new_tokens"), ("params", "top_k"), ("params", "stop"),
         ("params", "seed"), ("grid",), ("grid", "top_k"), ("expect",), ("expect", "tokens"),
         ("expect", "tie_margin"), ("timeouts",), ("timeouts", "load"), ("explain",), ("explain", "k"),
         ("sampling",), ("sampling", "samples")]

# values a user might plausibly write, so that mutations also reach the deeper checks
PLAUSIBLE = st.sampled_from([
    "hf", "vllm", "vllm-server", "openai", "lmdeploy", "float16", "bfloat16", "exact", "any", True, False, 0, 1, -1,
    2, 0.5, 1e9, 10**30, "", "smollm2-135m", "/no/such/model", {"engine": "hf"}, {"engine": "openai"},
    {"engine": "openai", "options": {"url": "http://10.0.0.1:8000/v1"}}, {"url": "http://127.0.0.1:1/v1"},
    {"file": "missing.txt"}, {"id": "chat", "text": "dup"}, {"top_k": [1, 2]}, {"top_q": [1]},
    {"tokens": "exact", "max_logprob_delta": 0}, [], [[]], {}, None, "\u202e\u0000\ud7ff", "é" * 300,
    {"k": 0.5}, {"samples": 10}, {"load": -1}, {"temperature": float("nan")}, float("inf"),
])
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=8)
VALUES = PLAUSIBLE | JSONISH


def _set(data: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        if isinstance(data, dict):
            data = data.setdefault(key, {})
        elif isinstance(data, list) and isinstance(key, int) and key < len(data):
            data = data[key]
        else:
            return
    if isinstance(data, dict) or isinstance(data, list) and isinstance(path[-1], int) and path[-1] < len(data):
        data[path[-1]] = value


def _delete(data: Any, path: tuple) -> None:
    for key in path[:-1]:
        data = data.get(key) if isinstance(data, dict) else None
    if isinstance(data, dict):
        data.pop(path[-1], None)


@st.composite
def scenario_data(draw) -> dict:
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["set", "set", "delete", "unknown", "huge", "duplicate", "empty"]))
        path = draw(st.sampled_from(SLOTS))
        if op == "set":
            _set(data, path, copy.deepcopy(draw(VALUES)))  # a copy: a later op may edit it in place
        elif op == "delete":
            _delete(data, path)
        elif op == "unknown":
            _set(data, path[:-1] + (draw(st.text(min_size=1, max_size=12)),), copy.deepcopy(draw(VALUES)))
        elif op == "huge":
            _set(data, draw(st.sampled_from([("prompts",), ("grid", "top_k"), ("grid", "seed"), ("grid", "top_p"),
                                             ("prompts", 2, "token_ids")])),
                 [draw(st.integers(1, 100)) for _ in range(draw(st.integers(200, 3000)))])
        elif op == "duplicate":
            prompts = data.get("prompts")
            data["prompts"] = [*(prompts if isinstance(prompts, list) else []), {"id": "chat", "text": "again"}]
        else:
            _set(data, path, copy.deepcopy(draw(st.sampled_from([[], {}, "", None]))))
    return data


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="parity-fuzz-") as tmp:
        yield Path(tmp)


def _scenario_file(workdir: Path, text: str | bytes) -> Path:
    path = workdir / f"s{random.getrandbits(48):x}.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    return path


def _run_scenario_commands(path: Path, workdir: Path, run: bool = True) -> None:
    check(parity_in_process("validate", str(path)), path)
    if run:
        check(parity_in_process("run", str(path), "--out", str(workdir / "reports")), path)


def _cannot_start(data: dict) -> bool:
    """Whether some engine names the missing interpreter: then `run` stops before starting any engine."""
    engines = data.get("engines")
    return isinstance(engines, dict) and any(isinstance(e, dict) and e.get("python") == NOWHERE
                                             for e in engines.values())


@fuzz_settings("scenario")
@given(data=scenario_data())
def test_fuzzed_scenarios_end_cleanly(workdir: Path, data: dict) -> None:
    path = _scenario_file(workdir, yaml.safe_dump(data, allow_unicode=True, sort_keys=False))
    _run_scenario_commands(path, workdir, run=_cannot_start(data))
    assert not list((workdir / "reports").glob("*/results.parquet"))  # nothing ran, nothing half-written


VALID_TEXT = yaml.safe_dump(BASE, sort_keys=False)
YAML_NOISE = st.sampled_from([
    "&a ", "*a", "*nothere", "<<: *a\n", "!!python/object/apply:os.system ['true']", "!!binary x", "!custom ",
    "\t", "\x00", "\ufeff", ": :", "- ", "{", "}", "[", "]", "'", '"', "\n  - ", "%YAML 1.1\n", "---\n", "...\n",
    "? ", "|", ">", "#", "\\", "engines:\n", "ref: {engine: hf}\n",
])
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)) + VALID_TEXT


@st.composite
def raw_text(draw) -> str | bytes:
    kind = draw(st.sampled_from(["truncate", "insert", "binary", "duplicate_key", "bomb", "recursive", "unicode"]))
    if kind == "truncate":
        return VALID_TEXT[: draw(st.integers(0, len(VALID_TEXT)))]
    if kind == "insert":
        text = VALID_TEXT
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(YAML_NOISE | st.text(max_size=10)) + text[at:]
        return text
    if kind == "binary":
        return draw(st.binary(max_size=400))
    if kind == "duplicate_key":
        return VALID_TEXT.replace("  other:", "  ref:" if draw(st.booleans()) else "  other:\n    engine: hf\n  other:")
    if kind == "bomb":
        return BOMB
    if kind == "recursive":
        return VALID_TEXT + "grid: &g {top_k: *g}\n"
    return VALID_TEXT.replace("hello", draw(st.text(min_size=1, max_size=30)).replace("\n", " ") or "x")


@fuzz_settings("raw")
@given(text=raw_text())
def test_broken_scenario_files_end_cleanly(workdir: Path, text: str | bytes) -> None:
    _run_scenario_commands(_scenario_file(workdir, text), workdir)


def test_the_unfuzzed_base_is_valid_and_stops_at_the_missing_interpreter(workdir: Path) -> None:
    path = _scenario_file(workdir, VALID_TEXT)
    assert parity_in_process("validate", str(path)).code == 0
    done = parity_in_process("run", str(path), "--out", str(workdir / "reports"))
    assert done.code == 3 and NOWHERE in done.stderr


# --- model names and the paths a user passes: whatever the operating system answers is one line -----------------

@pytest.fixture(scope="module")
def odd_places(workdir: Path) -> dict[str, Path]:
    """Real things a path may run into: a file, a folder without config.json, a config.json that is not JSON, a JSON
    list, or a folder, a symlink loop, a dangling link."""
    root = workdir / "odd"
    root.mkdir()
    (root / "file").write_text("x")
    (root / "empty").mkdir()
    for name, config in (("notjson", "{"), ("jsonlist", "[1]")):
        (root / name).mkdir()
        (root / name / "config.json").write_text(config)
    (root / "configdir" / "config.json").mkdir(parents=True)
    (root / "loop-a").symlink_to(root / "loop-b")
    (root / "loop-b").symlink_to(root / "loop-a")
    (root / "dangling").symlink_to(root / "gone")
    return {"file": root / "file", "empty": root / "empty", "notjson": root / "notjson",
            "jsonlist": root / "jsonlist", "configdir": root / "configdir", "loop": root / "loop-a",
            "dangling": root / "dangling", "through-file": root / "file" / "below", "missing": root / "no" / "such"}


@st.composite
def odd_path(draw, places: dict[str, Path]) -> str:
    """A path string: one of the odd places, something below it, a name too long for the file system, bytes no
    name may hold, or random text (anchored under the fuzz folder, so nothing is created elsewhere)."""
    kind = draw(st.sampled_from(["place", "below", "long", "nul", "text"]))
    if kind == "place":
        return str(places[draw(st.sampled_from(sorted(places)))])
    if kind == "below":
        return str(places[draw(st.sampled_from(sorted(places)))] / draw(st.text(min_size=1, max_size=8)))
    if kind == "long":
        return str(places["empty"] / (draw(st.sampled_from("aé漢")) * draw(st.integers(200, 6000))))
    if kind == "nul":
        return str(places["empty"]) + "/a\0b"
    return str(places["empty"] / draw(st.text(min_size=1, max_size=40)))


@fuzz_settings("model")
@given(data=st.data())
def test_fuzzed_model_names_are_one_line_errors(workdir: Path, odd_places: dict[str, Path], data) -> None:
    model = data.draw(odd_path(odd_places) | st.text(max_size=60) | st.just("~no-such-user/model"))
    text = yaml.safe_dump({**BASE, "model": model}, allow_unicode=True, sort_keys=False)
    path = _scenario_file(workdir, text)
    done = parity_in_process("validate", str(path))
    check(done, path)
    if done.code == 2 and "model:" in done.stderr:
        assert f"{path}:" in done.stderr and "use a named model" in done.stderr, done.stderr


PATH_COMMANDS = [("run", "@valid", "--out", "@"), ("explain", "@valid", "--out", "@"), ("run", "--resume", "@"),
                 ("report", "@"), ("report", "@run", "--out", "@"), ("baseline", "save", "@"),
                 ("baseline", "save", "@run", "--to", "@"), ("gate", "@valid", "--baseline", "@"),
                 ("gate", "@valid", "--baseline", "@baseline", "--junit", "@"),
                 ("gate", "@valid", "--baseline", "@baseline", "--summary", "@")]


@fuzz_settings("paths")
@given(data=st.data())
def test_fuzzed_user_paths_are_one_line_errors(workdir: Path, template: Path, odd_places: dict[str, Path],
                                               data) -> None:
    """--out, --baseline, --junit, --summary, --to and run directories given odd paths: exit 0 or a documented
    code, one line on error, never a traceback (no engine starts: the scenario names a missing interpreter)."""
    given_path = data.draw(odd_path(odd_places))
    known = {"@valid": str(workdir / "s.yaml"), "@run": str(template), "@baseline": str(template.parent / "baseline"),
             "@": given_path}
    words = [known.get(w, w) for w in data.draw(st.sampled_from(PATH_COMMANDS))]
    done = parity_in_process(*words)
    assert not done.traceback, (words, done.traceback)
    assert done.code in OK_CODES, (words, done.code, done.stderr[-1500:])
    if done.code != 0:
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (words, done.stderr)


COMMANDS = ["run", "validate", "explain", "transplant", "params", "gate", "report", "baseline save",
            "models prepare", "models list", "env list", "env create", "nosuch", ""]
OPTIONS = ["--engines", "--allow-missing", "--no-allow-missing", "--out", "--parallel", "--case", "--k", "--all",
           "--baseline", "--junit", "--summary", "--to", "--resume", "--dry-run", "--python", "--force", "--help",
           "--bogus", "-x", "--"]


@st.composite
def argv(draw, files: dict[str, Path]) -> list[str]:
    args = draw(st.sampled_from(COMMANDS)).split()
    for _ in range(draw(st.integers(0, 6))):
        args.append(draw(st.sampled_from([*OPTIONS, *files])) if draw(st.booleans()) else draw(st.one_of(
            st.text(max_size=12), st.integers(-5, 10**6).map(str), st.sampled_from(["", ",", ",,a,", "-1", "nan"]))))
    words = [str(files[a]) if a in files else a for a in args]
    if words[:2] == ["env", "create"]:
        words[2:] = ["no-such-env-" + w for w in words[2:3]] or ["no-such-env"]  # never build a real environment
    if words[:2] == ["models", "prepare"]:
        words[2:] = ["no-such-model-" + w for w in words[2:3]] or ["no-such-model"]  # never convert a model
    return words


@pytest.fixture(scope="module")
def argv_files(workdir: Path) -> dict[str, Path]:
    folder = workdir / "argv"
    folder.mkdir()
    (folder / "broken.yaml").write_text("model: [\n")
    (folder / "valid.yaml").write_text(VALID_TEXT)
    return {"@valid": folder / "valid.yaml", "@broken": folder / "broken.yaml", "@missing": folder / "nope.yaml",
            "@dir": folder, "@out": folder / "out"}


@fuzz_settings("argv")
@given(data=st.data())
def test_fuzzed_command_lines_end_cleanly(argv_files: dict[str, Path], data) -> None:
    words = data.draw(argv(argv_files))
    done = parity_in_process(*words)
    assert not done.traceback, (words, done.traceback)
    assert done.code in OK_CODES, (words, done.code, done.stderr[-1500:])
    assert "Traceback" not in done.stdout + done.stderr, words
    if done.code != 0 and "Usage:" not in done.stdout:  # a command group without its command shows its help
        assert len(done.stderr.strip().splitlines()) == 1, (words, done.stderr)


# --- what the harness reads back: run directories and baselines -------------------------------------------------

def _result(engine: str, case: str, ids: list[int]) -> Result:
    return Result(case_id=case, engine=engine, status="ok", prompt_ids=[1, 2], token_ids=ids, text="x",
                  chosen_logprobs=[-0.1] * len(ids), top_ids=[[i, 9] for i in ids],
                  top_logprobs=[[-0.1, -2.0]] * len(ids), finish_reason="length")


@pytest.fixture(scope="module")
def template(workdir: Path) -> Path:
    """A finished run directory written by the store's own functions, its baseline, and journals."""
    scenario_path = workdir / "s.yaml"
    scenario_path.write_text(VALID_TEXT)
    scenario = load(scenario_path)
    results = [_result(e, c.case_id, [5, 6, 7] if e == "ref" or c.case_id != "chat" else [5, 8, 7])
               for e in ("ref", "other") for c in scenario.cases]
    results.append(Result.engine_error("ids", "other", "engine error: planted"))
    results = [r for r in results if not (r.engine == "other" and r.case_id == "ids" and r.status == "ok")]
    verdicts = judge(scenario, {(r.engine, r.case_id): r for r in results}, lambda t: f"tok{t}")
    run = workdir / "template" / "20261123-000000-s"
    run.mkdir(parents=True)
    engine = EngineMeta(engine="hf", dtype="float32", threads=1, python=NOWHERE, model_path=str(workdir / "gone"))
    meta = RunMeta(run_id=run.name, scenario=str(scenario_path), scenario_name="s", scenario_text=VALID_TEXT,
                   model="tiny-llama", reference="ref", started="now", status="finished", exit_code=1,
                   prompt_ids={"p0": [1, 2], "chat": [1, 2], "ids": [1, 2, 3]},
                   engines={"ref": engine, "other": engine}, selection=RunSelection(engines=["ref", "other"]))
    write_parquet(run / "results.parquet", results_frame(results, {}, {}))
    write_parquet(run / "steps.parquet", steps_frame(results))
    write_parquet(run / "verdicts.parquet", verdicts)
    write_meta(run, meta)
    for name in ("ref", "other"):
        (run / "engines" / name).mkdir(parents=True)
        (run / "engines" / name / "results.jsonl").write_text(
            "".join(json.dumps(r.model_dump(mode="json")) + "\n" for r in results if r.engine == name))
    (run / "explain").mkdir()
    (run / "explain" / "localisation.json").write_text(json.dumps({"floor": "f", "k": 10, "localisations": [
        {"case_id": "chat", "engine": "other", "reference": "ref", "cause": "near_tie", "verdict": "v",
         "curve": [{"layer": 0, "error": 0.1, "floor": 0.01}]}]}))
    (run / "transplant").mkdir()
    (run / "transplant" / "verdicts.json").write_text(json.dumps([
        {"case_id": "chat", "engine": "other", "reference": "ref", "cause": "agree", "verdict": "v"}]))
    save_baseline(run, workdir / "template" / "baseline")
    for args in (["report", str(run)], ["baseline", "save", str(run), "--to", str(workdir / "b0")]):
        assert parity_in_process(*args).code == 0, args
    return run


PARQUETS = ["results.parquet", "steps.parquet", "verdicts.parquet"]
JSONS = ["run.json", "explain/localisation.json", "transplant/verdicts.json", "engines/ref/results.jsonl"]


def _edit_json(value: Any, draw) -> Any:
    """value with one nested entry replaced, deleted or added."""
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        op = draw(st.sampled_from(["set", "delete", "recurse"]))
        if op == "delete":
            return {k: v for k, v in value.items() if k != key}
        return {**value, key: _edit_json(value[key], draw) if op == "recurse" else copy.deepcopy(draw(VALUES))}
    if isinstance(value, list) and value and draw(st.booleans()):
        i = draw(st.integers(0, len(value) - 1))
        return [*value[:i], _edit_json(value[i], draw), *value[i + 1:]]
    return copy.deepcopy(draw(VALUES))  # a fresh copy: no shared constant is edited into a cycle later


def _edit_parquet(path: Path, draw) -> None:
    try:
        table = pq.read_table(path)
    except pa.ArrowException:  # already damaged by an earlier step
        return
    column = draw(st.sampled_from(table.column_names))
    op = draw(st.sampled_from(["drop", "retype", "null", "empty", "rename"]))
    if op == "drop":
        table = table.drop_columns([column])
    elif op == "rename":
        table = table.rename_columns([c if c != column else c + "_x" for c in table.column_names])
    elif op == "empty":
        table = table.slice(0, 0)
    else:
        values = [None] * table.num_rows if op == "null" else [
            draw(st.sampled_from(["x", 1, 2.5, True, "[1]", "{}", "null"])) for _ in range(table.num_rows)]
        values = [str(v) for v in values] if op == "retype" else values
        array = pa.array(values, type=pa.string() if op == "retype" else table.schema.field(column).type)
        table = table.set_column(table.column_names.index(column), column, array)
    pq.write_table(table, path)


@st.composite
def damage(draw) -> list:
    return [(draw(st.sampled_from(["delete", "truncate", "garbage", "edit_json", "edit_parquet"])),
             draw(st.sampled_from(PARQUETS + JSONS)), draw(st.randoms(use_true_random=False)))
            for _ in range(draw(st.integers(1, 2)))]


def _apply(run: Path, plan: list, draw) -> None:
    for op, name, rnd in plan:
        path = run / name
        if not path.exists():
            continue
        if op == "delete":
            path.unlink()
        elif op == "truncate":
            data = path.read_bytes()
            path.write_bytes(data[: rnd.randrange(len(data) + 1)])
        elif op == "garbage":
            path.write_bytes(rnd.randbytes(rnd.randrange(1, 300)))
        elif op == "edit_json" and name.endswith(".json"):
            try:
                value = json.loads(path.read_text())
            except ValueError:  # already damaged by an earlier step
                continue
            path.write_text(json.dumps(_edit_json(value, draw), allow_nan=True))
        elif op == "edit_parquet" and name.endswith(".parquet"):
            _edit_parquet(path, draw)


@fuzz_settings("run_dir")
@given(data=st.data())
def test_damaged_run_directories_are_one_line_errors(template: Path, workdir: Path, data) -> None:
    run = workdir / "damaged" / template.name
    shutil.rmtree(run.parent, ignore_errors=True)
    shutil.copytree(template, run)
    _apply(run, data.draw(damage()), data.draw)
    for args in (["report", str(run)], ["baseline", "save", str(run), "--to", str(workdir / "b")],
                 ["run", "--resume", str(run)]):
        done = parity_in_process(*args)
        check(done, run if done.code == 2 else None)


@st.composite
def damaged_baseline(draw, text: str) -> str:
    lines = text.splitlines()
    op = draw(st.sampled_from(["truncate", "garbage_line", "edit_record", "drop_header", "empty"]))
    if op == "truncate":
        return text[: draw(st.integers(0, len(text)))]
    if op == "garbage_line":
        lines.insert(draw(st.integers(0, len(lines))), draw(st.text(max_size=30)).replace("\n", " "))
    elif op == "edit_record":
        i = draw(st.integers(0, len(lines) - 1))
        lines[i] = json.dumps(_edit_json(json.loads(lines[i]), draw), allow_nan=True)
    elif op == "drop_header":
        lines = lines[1:]
    else:
        lines = []
    return "\n".join(lines) + "\n"


@fuzz_settings("baseline")
@given(data=st.data())
def test_damaged_baselines_are_one_line_errors(template: Path, workdir: Path, data) -> None:
    folder = workdir / "baseline-damaged"
    folder.mkdir(exist_ok=True)
    text = (template.parent / "baseline" / "s.jsonl").read_text()
    (folder / "s.jsonl").write_text(data.draw(damaged_baseline(text)))
    done = parity_in_process("gate", str(workdir / "s.yaml"), "--baseline", str(folder), "--out",
                             str(workdir / "gate-reports"))
    check(done, folder / "s.jsonl" if done.code == 2 else None)


@fuzz_settings("journal")
@given(data=st.binary(max_size=600) | st.text(max_size=600).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_journal_bytes_read_without_raising(workdir: Path, data: bytes) -> None:
    good = (workdir / "template" / "20261123-000000-s" / "engines" / "ref" / "results.jsonl").read_bytes()
    path = workdir / "journal.jsonl"
    path.write_bytes(good + data)
    results, _ = read_journal(path)
    assert {"p0", "chat", "ids"} <= set(results)  # the complete lines before the noise all survive


def test_real_exit_codes_in_subprocesses(template: Path, workdir: Path) -> None:
    """A few of the fuzzed kinds through `python -m harness` in a subprocess: the exit code a shell or CI sees."""
    binary = _scenario_file(workdir, b"\x80\x81 not yaml")
    truncated = _scenario_file(workdir, VALID_TEXT[:37])
    valid = _scenario_file(workdir, VALID_TEXT)
    damaged = workdir / "subprocess" / template.name
    shutil.copytree(template, damaged)
    (damaged / "steps.parquet").write_bytes(b"PAR1")
    for args, code, words in (
            (["validate", str(binary)], 2, "not UTF-8 text"), (["run", str(truncated)], 2, str(truncated)),
            (["run", "--bogus"], 2, "No such option"), (["report", str(damaged)], 2, "steps.parquet: unreadable"),
            (["run", str(valid), "--out", str(workdir / "sub-reports")], 3, NOWHERE)):
        done = parity(*args)
        assert done.code == code and words in done.stderr, (args, done.code, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
