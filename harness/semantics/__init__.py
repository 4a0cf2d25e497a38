"""Sampling semantics: what each param means, and what each engine's own code does with them (effective params,
preflight), run in the engine's interpreter."""
