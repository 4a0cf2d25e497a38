"""tiny-agent: a tiny Llama that speaks tool calls and thinking the same way on every engine.

A random model emits a call only when made to, and a constraint reaches some engines only. This one is built so that
greedy decoding follows a script: its next token is a function of the last CONTEXT tokens, so every engine that runs
it right writes the same well-formed think block and calls, and one that renders another prompt, or runs the model
wrong, writes something else.

How the weights do it (hidden = 6 slots of SLOT dims: the current token and the three before it, a decision slot, a
bias slot):
- each token's embedding is an identity vector in slot 0 (orthonormal for the tokens the scripts read, random unit
  vectors for the rest) plus a constant in the bias slot, so every embedding has the same norm;
- layer 0's heads 1..3 read the previous 1..3 tokens: their queries and keys are constants (from the bias slot) set
  so that after rope the score is A x sum_i cos((m - n - d) w_i), sharp at distance d, and each copies the identity of
  the token it reads into slot d;
- layer 1's MLP has one unit per context of the scripts: it fires only where all four slots hold that context's
  tokens (four matches against a threshold of 3.5) and writes its next token's direction into the decision slot;
- the head (untied) reads the decision slot, where each unit also writes a runner-up (one token the scripts never
  write) at RUNNER_UP of the next token's logit. The builder checks that the four-token context tells every step of
  every script apart; every other weight is small noise that moves no choice.
The tokenizer is SmolLM2's with <think>, </think>, <tool_call>, </tool_call>, <tool_response>, </tool_response> added
(plain added tokens, as Qwen3 has them), and the chat template (agent_template.jinja) is a Qwen3-style one written
for this project: a tools block in the system turn, calls in <tool_call> tags, tool results as user turns, and an
enable_thinking switch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEMPLATE = Path(__file__).with_name("agent_template.jinja")
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
SLOT = 64  # dims per slot (hidden = (CONTEXT + 2) x SLOT)
CONTEXT = 4  # tokens the next token is a function of
THETA = 10000.0  # rope base
DECIDE = CONTEXT * SLOT  # the decision slot's first dim
BIAS = DECIDE + SLOT  # the bias slot's constant dim
HEAD_DIM = 64
SCORE = 25.0  # the previous-token heads' scale: about 27 nats between the token read and its neighbours
FIRE = 20.0  # a context unit's gate: silu(10) where its four tokens match, silu(-10) where three do
DECISION = 0.2  # what a firing unit writes into the decision slot, per unit of its gate's output
LOGIT = 4.0  # the head's scale: a script's next token at about 46 (measured)
# every step's runner-up, the same token throughout (one the scripts never write), at this share of the next token's
# logit: about 9 nats below it, so a repetition penalty of 1.3 on a token already seen flips it (what the invariance
# checks' negative control needs to see), while rounding never does
RUNNER_UP = 0.8
RUNNER_UP_TOKEN = 49151  # SmolLM2's last regular token ('ectable')


@dataclass(frozen=True)
class Script:
    """What the model answers after a generation prompt ending in `prompt_tail` (rendered text)."""

    name: str
    prompt_tail: str
    answer: str


WEATHER_CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
# compact, and without newlines in its tags: its tokens differ from the first call's
TIME_CALL = '{"name":"local_time","arguments":{"city":"Paris"}}'
SCRIPTS = [
    # thinking on: a think block, then two calls
    Script("calls", "<|im_start|>assistant\n",
           "<think>\nThe user asks about Paris: I call get_weather and local_time.\n</think>\n\n"
           f"<tool_call>\n{WEATHER_CALL}\n</tool_call>\n<tool_call>{TIME_CALL}</tool_call>"),
    # thinking off (the template's empty think block): a plain answer, as after a tool's result
    Script("answer", "<|im_start|>assistant\n<think>\n\n</think>\n\n", "It is 18 degrees and sunny in Paris."),
]


def tokenizer_with_agent_tokens(tokenizer: Any) -> Any:
    """SmolLM2's tokenizer with the agent tokens added (not special: their text stays in decoded answers, which is
    what tool and reasoning parsers read) and tiny-agent's chat template."""
    from tokenizers import AddedToken

    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    tokenizer.chat_template = TEMPLATE.read_text()
    return tokenizer


def script_chains(tokenizer: Any) -> list[list[int]]:
    """Each script as ids: the last CONTEXT ids of its prompt tail, then its answer and EOS."""
    chains = []
    for script in SCRIPTS:
        tail = tokenizer.encode(script.prompt_tail, add_special_tokens=False)
        answer = tokenizer.encode(script.answer, add_special_tokens=False)
        chains.append(tail[-CONTEXT:] + answer + [tokenizer.eos_token_id])
    return chains


def next_tokens(chains: list[list[int]]) -> dict[tuple[int, ...], int]:
    """Each context (CONTEXT ids, oldest first) -> the next id. Raises where two scripts' steps share a context but
    not a next token (the scripts need a longer context, or other words)."""
    table: dict[tuple[int, ...], int] = {}
    for chain in chains:
        for n in range(CONTEXT - 1, len(chain) - 1):
            key = tuple(chain[n - CONTEXT + 1: n + 1])
            if table.setdefault(key, chain[n + 1]) != chain[n + 1]:
                raise ValueError(f"tiny-agent's scripts: context {key} is followed by {table[key]} and "
                                 f"{chain[n + 1]}: reword a script")
    return table


def build(tokenizer: Any) -> Any:
    """The model in float32 (deterministic: the same weights on every machine)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    table = next_tokens(script_chains(tokenizer))
    hidden = (CONTEXT + 2) * SLOT
    units = len(table)
    if units > 2 * SLOT:
        raise ValueError(f"tiny-agent's scripts have {units} steps, more than {2 * SLOT}: shorten them")
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * SLOT,
                         num_hidden_layers=2, num_attention_heads=hidden // HEAD_DIM,
                         num_key_value_heads=hidden // HEAD_DIM, head_dim=HEAD_DIM, max_position_embeddings=2048,
                         rope_theta=THETA, rms_norm_eps=1e-6, tie_word_embeddings=False, **ids)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 1e-3)  # noise that moves no choice, so no capture point reads exactly zero
        for norm in [m for name, m in model.named_modules() if name.endswith("norm")]:
            norm.weight.fill_(1.0)
        identity = _identities(len(tokenizer), {t for key in table for t in key} | set(table.values()))
        embed = model.model.embed_tokens.weight
        embed.zero_()
        embed[:, :SLOT] = identity
        embed[:, BIAS] = 1.0  # the bias slot's constant: every embedding has norm sqrt(2)
        _previous_token_heads(model.model.layers[0].self_attn, hidden, THETA)
        if RUNNER_UP_TOKEN in {t for key in table for t in key} | set(table.values()):
            raise ValueError(f"tiny-agent's scripts write its runner-up token {RUNNER_UP_TOKEN}: pick another")
        successors = _identities(len(tokenizer), set(table.values()) | {RUNNER_UP_TOKEN}, scale=0.0)
        _context_units(model.model.layers[1].mlp, identity, successors, table, hidden)
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, DECIDE:DECIDE + SLOT] = successors * LOGIT
    model.generation_config = GenerationConfig(**ids)
    return model


def _identities(vocab: int, scripted: set[int], scale: float = 1.0) -> Any:
    """A unit vector per token: orthonormal for the scripted ones (up to SLOT of them), random for the rest (times
    scale: 0 leaves the rest out)."""
    import torch

    if len(scripted) > SLOT:
        raise ValueError(f"tiny-agent's scripts read {len(scripted)} distinct tokens, more than {SLOT}: shorten them")
    vectors = torch.randn(vocab, SLOT)
    vectors *= scale / vectors.norm(dim=1, keepdim=True)
    basis = torch.linalg.qr(torch.randn(SLOT, SLOT))[0]
    for row, token in enumerate(sorted(scripted)):
        vectors[token] = basis[row]
    return vectors


def _previous_token_heads(attention: Any, hidden: int, theta: float) -> None:
    """Heads 1..CONTEXT-1 of layer 0 read the token d = 1..CONTEXT-1 back and write its identity into slot d."""
    import torch

    half = HEAD_DIM // 2
    frequencies = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / HEAD_DIM)
    rms = (2.0 / hidden) ** 0.5  # every embedding's RMS: the input norm scales each one by 1 / rms
    for d in range(1, CONTEXT):
        rows = slice(d * HEAD_DIM, (d + 1) * HEAD_DIM)
        # rope turns query pair i by m w_i and key pair i by n w_i (HF's rotate_half layout: pair i is (i, i + half)):
        # a key of (1, 0) and a query of A (cos d w_i, -sin d w_i) score A sum_i cos((m - n - d) w_i)
        query = torch.cat([torch.cos(d * frequencies), -torch.sin(d * frequencies)]) * SCORE * HEAD_DIM ** 0.5
        key = torch.cat([torch.ones(half), torch.zeros(half)]).double()
        attention.q_proj.weight[rows, :] = 0.0
        attention.k_proj.weight[rows, :] = 0.0
        attention.v_proj.weight[rows, :] = 0.0
        attention.q_proj.weight[rows, BIAS] = (query * rms).float()
        attention.k_proj.weight[rows, BIAS] = (key * rms).float()
        attention.v_proj.weight[rows, :SLOT] = torch.eye(SLOT) * rms  # the read token's identity, at norm 1
        attention.o_proj.weight[:, rows] = 0.0
        attention.o_proj.weight[d * SLOT:(d + 1) * SLOT, rows] = torch.eye(SLOT)


def _context_units(mlp: Any, identity: Any, successors: Any, table: dict[tuple[int, ...], int], hidden: int) -> None:
    """One MLP unit per context: gate FIRE x (matching slots - 3.5), up 1 (from the bias slot), down the next
    token's direction in the decision slot, with the runner-up's at RUNNER_UP of it."""
    rms = (CONTEXT + 1.0) ** 0.5 / hidden ** 0.5  # the residual's RMS here: four identities and the bias
    for weight in (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight):
        weight.zero_()
    for unit, (key, following) in enumerate(table.items()):
        for d, token in enumerate(reversed(key)):
            mlp.gate_proj.weight[unit, d * SLOT:(d + 1) * SLOT] = identity[token] * FIRE * rms
        mlp.gate_proj.weight[unit, BIAS] = -(CONTEXT - 0.5) * FIRE * rms
        mlp.up_proj.weight[unit, BIAS] = rms
        mlp.down_proj.weight[DECIDE:DECIDE + SLOT, unit] = (successors[following]
                                                            + successors[RUNNER_UP_TOKEN] * RUNNER_UP) * DECISION
