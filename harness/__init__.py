"""llm-parity: differential testing of LLM inference engines."""
