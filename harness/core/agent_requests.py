"""What agents send: tool definitions, a tool choice, messages with assistant calls and tool results, and the chat
template's own switches (chat_template_kwargs), checked as the OpenAI chat API and the chat templates read them.

Messages are kept as the chat template receives them (a call's arguments as a JSON object); servers get the API's
wire form (arguments as a JSON string: wire_messages)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _name(value: str) -> str:
    if not value or len(value) > 64 or set(value) - NAME_CHARS:
        raise ValueError(f"function name {value!r}: use 1-64 letters, digits, _ - or . (the OpenAI API's rule)")
    return value


FunctionName = Annotated[str, AfterValidator(_name)]


class Function(Strict):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _json_schema_object(cls, schema: dict[str, Any]) -> dict[str, Any]:
        """A JSON Schema whose instances are objects (a call's arguments always are), and valid as a schema."""
        import jsonschema

        if schema.get("type") != "object":
            raise ValueError("parameters must be a JSON Schema of an object (type: object), as a call's arguments "
                             f"are an object; got type {schema.get('type')!r}")
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"parameters is not a valid JSON Schema: {exc.message}") from None
        return schema


class Tool(Strict):
    type: Literal["function"] = "function"
    function: Function


class NamedChoice(Strict):
    type: Literal["function"] = "function"
    function: dict[str, str]

    @field_validator("function")
    @classmethod
    def _names_one(cls, function: dict[str, str]) -> dict[str, str]:
        if set(function) != {"name"}:
            raise ValueError("a named tool_choice is {type: function, function: {name: NAME}}")
        return function


ToolChoice = Literal["auto", "none", "required"] | NamedChoice


class CallFunction(Strict):
    name: FunctionName
    arguments: dict[str, Any] | str  # a string must hold a JSON object

    @field_validator("arguments")
    @classmethod
    def _an_object(cls, arguments: dict[str, Any] | str) -> dict[str, Any]:
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise ValueError("arguments is a string that is not JSON: write them as a mapping") from None
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
        return arguments


class ToolCall(Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: CallFunction


class Message(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


def message_order_problem(messages: list[Message], tools: list[Tool]) -> tuple[int, str] | None:
    """(index, why) of the first message a chat API and its templates cannot take in this order, or None."""
    names = {t.function.name for t in tools}
    open_calls: list[ToolCall] = []
    for i, message in enumerate(messages):
        if message.role == "system" and i:
            return i, "a system message comes first or not at all"
        if message.role != "assistant" and message.tool_calls:
            return i, f"a {message.role} message carries tool_calls: only an assistant message does"
        if message.role in ("system", "user") and message.content is None:
            return i, f"a {message.role} message needs content"
        if message.role == "tool":
            if not open_calls:
                return i, "a tool result follows no assistant message with tool_calls: put the call before it"
            ids = [c.id for c in open_calls if c.id]
            if message.content is None:
                return i, "a tool result needs content (the tool's answer)"
            if ids and message.tool_call_id not in ids:
                return i, f"tool_call_id {message.tool_call_id!r} names none of the calls before it ({', '.join(ids)})"
            continue
        open_calls = list(message.tool_calls or [])
        unknown = [c.function.name for c in open_calls if names and c.function.name not in names]
        if unknown:
            return i, f"a call to {unknown[0]!r}, which is not among the scenario's tools ({', '.join(sorted(names))})"
    if messages and messages[-1].role == "assistant":
        return len(messages) - 1, "the last message is the assistant's: end with a user message or a tool result"
    return None


def template_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages as chat templates take them: fields left unset are left out, arguments are mappings."""
    return [m.model_dump(exclude_none=True) for m in messages]


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the OpenAI chat API carries them: each call with an id (call_<message>_<call> where the scenario
    gives none) and its arguments as a JSON string; a tool result without tool_call_id answers the next open call."""
    out: list[dict[str, Any]] = []
    open_ids: list[str] = []
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if calls:
            calls = [{**call, "id": call.get("id") or f"call_{i}_{j}", "type": "function",
                      "function": {**call["function"], "arguments": json.dumps(call["function"]["arguments"])}}
                     for j, call in enumerate(calls)]
            open_ids = [call["id"] for call in calls]
            message = {**message, "tool_calls": calls}
        elif message.get("role") == "tool":
            if "tool_call_id" not in message and open_ids:
                message = {**message, "tool_call_id": open_ids[0]}
            if message.get("tool_call_id") in open_ids:
                open_ids.remove(message["tool_call_id"])
        out.append(message)
    return out
