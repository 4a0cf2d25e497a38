"""Scenario files: validation with file:line errors, expansion into cases, each engine's description resolved once,
prompt tokenisation and identity."""
