"""A planted reasoning-parser fault for scenarios/agent-faults.yaml, as a vLLM plugin (--reasoning-parser-plugin
this file): think_leaks_end is a <think>...</think> parser that leaves a bare </think> in the content (sglang#36285
class), whole and streamed."""

from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.reasoning import ReasoningParserManager
from vllm.reasoning.basic_parsers import BaseThinkingReasoningParser


@ReasoningParserManager.register_module("think_leaks_end")
class ThinkLeaksEnd(BaseThinkingReasoningParser):
    @property
    def start_token(self) -> str:
        return "<think>"

    @property
    def end_token(self) -> str:
        return "</think>"

    def extract_reasoning(self, model_output, request):
        reasoning, content = super().extract_reasoning(model_output, request)
        if self.end_token in model_output:
            content = self.end_token + (content or "")
        return reasoning, content

    def extract_reasoning_streaming(self, previous_text, current_text, delta_text, previous_token_ids,
                                    current_token_ids, delta_token_ids):
        if list(delta_token_ids) == [self.end_token_id]:
            return DeltaMessage(content=self.end_token)
        return super().extract_reasoning_streaming(previous_text, current_text, delta_text, previous_token_ids,
                                                   current_token_ids, delta_token_ids)
