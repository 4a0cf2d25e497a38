"""Which parsers run an engine's answers offline: vLLM's for the vLLM engines, lmdeploy's for its api_server (each
the server's own code, adapters.engines.vllm_parsers and lmdeploy_parsers); the others have none here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.engines.parser_runs import ParserOptions, Parsing

FAMILIES = {"vllm": "vllm", "vllm-server": "vllm", "lmdeploy-server": "lmdeploy"}  # engine type -> its parsers


def parsing_for(engine: str, parsers: ParserOptions, model_path: Path, request: dict[str, Any]) -> Parsing | None:
    """The runner of an engine's own parsers for one chat request (the API's fields), or None where the engine
    type has no parsers of its own here."""
    family = FAMILIES.get(engine)
    if family == "vllm":
        from adapters.engines.vllm_parsers import VllmParsing

        return VllmParsing(parsers, model_path, request)
    if family == "lmdeploy":
        from adapters.engines.lmdeploy_parsers import LmdeployParsing

        return LmdeployParsing(parsers, model_path, request)
    return None


