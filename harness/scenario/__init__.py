"""Scenario files: the canonical parameter vocabulary, validation with file:line errors, expansion into cases,
prompt tokenisation."""
