"""For mypy only: every built-in engine's Engine class held to the contract a worker relies on (adapters.contract:
Engine, plus TracingEngine where its capabilities say traces and ScoringEngine where they say scores).

Each function builds the engine as the worker does, `Engine(setup)`, and returns it as the protocol: mypy checks the
constructor against the call and the instance against the protocol, and names the members that differ (a
`type[Engine]` annotation would leave the constructor out). Everything is under TYPE_CHECKING, so importing this
module imports no engine module and no engine package. mypy.ini checks it; tests/unit/test_engine_contract_types.py
runs mypy and checks that it names every module of adapters.registry.BUILTIN with the protocol its capabilities
call for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adapters.contract import Engine, ScoringEngine, TracingEngine
    from adapters.engines import (
        hf,
        llamacpp,
        llamacpp_server,
        lmdeploy_pipeline,
        lmdeploy_server,
        openai,
        vllm_offline,
        vllm_server,
    )
    from harness.core.types import EngineSetup

    def hf_engine(setup: EngineSetup) -> TracingEngine:
        return hf.Engine(setup)

    def vllm_engine(setup: EngineSetup) -> TracingEngine:
        return vllm_offline.Engine(setup)

    def llamacpp_engine(setup: EngineSetup) -> TracingEngine:
        return llamacpp.Engine(setup)

    def llamacpp_server_engine(setup: EngineSetup) -> ScoringEngine:
        return llamacpp_server.Engine(setup)

    def vllm_server_engine(setup: EngineSetup) -> ScoringEngine:
        return vllm_server.Engine(setup)

    def openai_engine(setup: EngineSetup) -> Engine:
        return openai.Engine(setup)

    def lmdeploy_engine(setup: EngineSetup) -> Engine:
        return lmdeploy_pipeline.Engine(setup)

    def lmdeploy_server_engine(setup: EngineSetup) -> Engine:
        return lmdeploy_server.Engine(setup)
