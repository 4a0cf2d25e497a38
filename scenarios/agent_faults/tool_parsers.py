"""Planted tool-parser faults for scenarios/agent-faults.yaml, as vLLM plugins (--tool-parser-plugin this file).
Each is vLLM's hermes parser with one bug of a kind reported against real parsers:

- hermes_drops_brace (vllm#22885 class): a streamed call's arguments lose their closing "}";
- hermes_loses_whole_call (vllm#47901, #48347 class): when one delta brings a call's name and arguments together,
  the arguments are dropped.
The unstreamed path is untouched in both: only a streamed answer, or the same ids fed in chunks, shows them."""

from vllm.entrypoints.generate.base.protocol import DeltaFunctionCall
from vllm.tool_parsers import ToolParserManager
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser


def _function(call):
    return call.function if isinstance(call.function, dict) else (call.function.model_dump(exclude_none=True)
                                                                  if call.function is not None else {})


@ToolParserManager.register_module("hermes_drops_brace")
class HermesDropsBrace(Hermes2ProToolParser):
    def extract_tool_calls_streaming(self, *args, **kwargs):
        delta = super().extract_tool_calls_streaming(*args, **kwargs)
        for call in (delta.tool_calls if delta is not None else None) or []:
            function = _function(call)
            arguments = function.get("arguments") or ""
            sent = self.streamed_args_for_tool[call.index] if call.index < len(self.streamed_args_for_tool) else ""
            if arguments.endswith("}") and sent.endswith(arguments) and sent.count("{") == sent.count("}"):
                # the last brace never reaches the client
                call.function = DeltaFunctionCall(**{**function, "arguments": arguments[:-1]})
        return delta


@ToolParserManager.register_module("hermes_loses_whole_call")
class HermesLosesWholeCall(Hermes2ProToolParser):
    def extract_tool_calls_streaming(self, *args, **kwargs):
        delta = super().extract_tool_calls_streaming(*args, **kwargs)
        calls = (delta.tool_calls if delta is not None else None) or []
        named = {c.index for c in calls if _function(c).get("name")}
        for call in calls:
            function = _function(call)
            if call.index in named and function.get("arguments") and not function.get("name"):
                # the name and the arguments came together: the arguments are lost
                call.function = DeltaFunctionCall(**{**function, "arguments": ""})
        return delta
