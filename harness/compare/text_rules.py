"""What the client receives, judged from the ids: an engine's text against the reference tokenizer's decoding of that
engine's own token ids, its stop-string trimming and the token counts a server reports; how the ids ended (finish
reason, stop strings, ignore_eos) is read once, by harness.compare.ending, and its findings are the answer's too.

A text that matches no reading of its own ids is a detokeniser finding (the ids may agree with the reference while the
text does not). The readings an engine may give, each a documented rule of some engine:
  as the ids         the decoding of every generated id (HF, llama.cpp: whole tokens)
  stop token cut     the same without the text of the stop token (EOS or a stop token id) that ended it (vLLM unless
                     include_stop_str_in_output)
  cut before stop    cut where a requested stop string starts (vLLM, OpenAI)
  cut after stop     cut where the stop string ends (vLLM with include_stop_str_in_output)
  partial char held  without the U+FFFD of a last character whose bytes are not all generated yet (vLLM's
                     incremental detokeniser holds them back; HF's decode writes U+FFFD)
Where the engine's effective include_stop_str_in_output is known, the trimming must follow it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.compare.ending import Ending

AS_IDS, STOP_TOKEN_CUT, BEFORE_STOP, AFTER_STOP, PARTIAL_HELD, DIFFERS = (
    "as the ids", "stop token cut", "cut before stop", "cut after stop", "partial char held", "differs")
REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that are not (yet) a whole UTF-8 character


@dataclass(frozen=True)
class Reading:
    """How one engine's answer reads against its own ids."""

    ids_text: str  # the reference tokenizer's decoding of the engine's ids
    text_check: str  # one of the readings above
    findings: list[str]  # each a sentence; none: as expected


def readings(ids: list[int], decode: Callable[[list[int]], str], ending: Ending) -> list[tuple[str, str]]:
    """Each reading's text of these ids (a held partial character: the tokens that hold its bytes left out, up to
    three, as a UTF-8 character has at most four bytes)."""
    full = decode(ids)
    out = [(AS_IDS, full)]
    if ending.last_id_ends:
        out.append((STOP_TOKEN_CUT, decode(ids[:-1])))
    if ending.stop is not None:
        stop = ending.stop
        out += [(BEFORE_STOP, full[: stop.char]), (AFTER_STOP, full[: stop.char + len(stop.stop)])]
    if full.endswith(REPLACEMENT):
        out += [(PARTIAL_HELD, decode(ids[:-k])) for k in range(1, min(3, len(ids)) + 1)]
    return out


def read_answer(text: str, ids: list[int], decode: Callable[[list[int]], str], ending: Ending, *,
                include_stop: bool | None, usage: dict[str, int], prompt_len: int) -> Reading:
    """Judge one engine's answer (text, usage) against its own ids, and how they ended (harness.compare.ending: its
    findings are the answer's too); `decode` writes the ids as the answer is written (ending.skip_special)."""
    texts = readings(ids, decode, ending)
    full = texts[0][1]
    check = next((name for name, candidate in texts if candidate == text), DIFFERS)
    findings = []
    if check == DIFFERS:
        findings.append(text_difference(text, full))
    elif ending.stop is not None and include_stop is not None:
        kept = check in (AS_IDS, AFTER_STOP)
        if kept != include_stop:
            findings.append(f"the stop string {ending.stop.stop!r} is {'kept' if kept else 'cut'} but the engine's "
                            f"include_stop_str_in_output is {include_stop}")
    findings += [*ending.findings, *usage_findings(usage, len(ids), prompt_len)]
    return Reading(full, check, findings)


def usage_findings(usage: dict[str, int], generated: int, prompt_len: int) -> list[str]:
    """A server's reported counts against the ids it returned."""
    found = []
    if "completion_tokens" in usage and usage["completion_tokens"] != generated:
        found.append(f"usage says {usage['completion_tokens']} completion tokens, the answer has {generated} ids")
    if "prompt_tokens" in usage and prompt_len and usage["prompt_tokens"] != prompt_len:
        found.append(f"usage says {usage['prompt_tokens']} prompt tokens, the prompt has {prompt_len} ids")
    return found


def text_difference(text: str, expected: str, against: str = "the decoding of its own ids",
                    finding: str = "detokeniser: ") -> str:
    """Where an engine's text first leaves what it is held to (the decoding of its own ids), in one sentence."""
    at = next((i for i, (a, b) in enumerate(zip(text, expected)) if a != b), min(len(text), len(expected)))
    sentence = (f"{finding}the text leaves {against} at character {at}: "
                f"{_clip(text, at)!r} against {_clip(expected, at)!r}")
    if REPLACEMENT in text and REPLACEMENT not in expected:
        sentence += "; it holds U+FFFD where the ids decode to a whole character (a multi-byte character cut)"
    return sentence


def _clip(text: str, at: int, width: int = 12) -> str:
    return text[max(0, at - width): at + width]


def delta_findings(deltas: list[str], text: str, stops: list[str], include_stop: bool | None) -> list[str]:
    """A streamed answer's chunks: each must be whole text (no U+FFFD where the final text has none) and no chunk may
    leak a stop string the final text cut."""
    found = []
    joined = "".join(deltas)
    if deltas and joined != text:
        found.append(f"the streamed chunks join to {len(joined)} characters, the text has {len(text)}")
    cut = [i for i, d in enumerate(deltas) if REPLACEMENT in d and REPLACEMENT not in text]
    if cut:
        found.append(f"chunk {cut[0]} holds U+FFFD: a multi-byte character split between chunks")
    if include_stop is False:
        leaked = [s for s in stops if s and s in joined and s not in text]
        if leaked:
            found.append(f"the chunks leak the stop string {leaked[0]!r} the text cut")
    return found
