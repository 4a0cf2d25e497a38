"""Prompt identity: whether each prompt's token ids are what the model expects, checked in the harness before any
engine runs. A prompt can be wrong in ways no engine comparison shows (every engine gets the same wrong ids): a
missing BOS where the tokenizer adds one, a BOS doubled (a template or text that writes it, and a tokenizer that adds
it), or special tokens written inside text, which tokenise as control tokens, not as the text they spell.
"""

from __future__ import annotations

from adapters.contract import OwnBosRule
from harness.scenario.prompts import PromptTokenizer
from harness.scenario.spec import LoadedScenario, PromptSpec


def prompt_warnings(tokenizer: PromptTokenizer, prompt: PromptSpec, ids: list[int]) -> list[str]:
    """What is off about one prompt's ids, in words; empty when nothing is."""
    found = []
    bos = tokenizer.bos()
    if bos is not None:
        bos_id, bos_text = bos
        rule = tokenizer.bos_rule()
        if rule and ids and ids[0] != bos_id:
            found.append(f"missing BOS: the model expects {bos_text} (id {bos_id}) first ({rule}), these ids start "
                         f"with {ids[0]}")
        if len(ids) > 1 and ids[0] == ids[1] == bos_id:
            found.append(f"doubled BOS: the ids start with {bos_text} (id {bos_id}) twice")
    texts = [prompt.text] if prompt.text is not None else [m.content or "" for m in prompt.messages or []]
    pattern = tokenizer.special_pattern
    special = sorted({token for text in texts for token in pattern.findall(text)}) if pattern else []
    if special:
        found.append(f"special token(s) {', '.join(special)} written inside the prompt's text: they tokenise as "
                     "control tokens, not as the text they spell")
    return found


def check_prompts(tokenizer: PromptTokenizer, prompts: list[PromptSpec],
                  ids: dict[str, list[int]]) -> dict[str, list[str]]:
    """Prompt id -> its warnings, for the prompts that have any."""
    checked = {p.id: prompt_warnings(tokenizer, p, ids[p.id]) for p in prompts}
    return {pid: found for pid, found in checked.items() if found}


def own_bos_warnings(rule: OwnBosRule, ids: list[int]) -> list[str]:
    """What is off about prompt ids for an engine that reads a model file of its own (a user's GGUF), by that file's
    BOS rule."""
    if not ids or rule.bos_id is None:
        return []
    if rule.add_bos and ids[0] != rule.bos_id:
        return [f"missing BOS for its own model file: {rule.source} asks for id {rule.bos_id} first, these ids start "
                f"with {ids[0]}"]
    if rule.add_bos is False and ids[0] == rule.bos_id:
        return [f"a BOS its own model file does not ask for ({rule.source}): these ids start with id {rule.bos_id}"]
    return []


def check_engine_prompts(scenario: LoadedScenario, prompts: list[PromptSpec],
                         ids: dict[str, list[int]]) -> dict[str, dict[str, list[str]]]:
    """Engine -> prompt id -> its warnings, for engines whose configuration names a model file with a BOS rule of
    its own (the same prompt ids go to every engine)."""
    found = {}
    for name, engine in scenario.spec.engines.items():
        rule = scenario.description(name).own_bos_rule(engine.options)
        warned = {p.id: w for p in prompts if (w := own_bos_warnings(rule, ids[p.id]))} if rule else {}
        if warned:
            found[name] = warned
    return found
