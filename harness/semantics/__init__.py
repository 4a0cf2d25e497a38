"""Sampling semantics: what each engine's own code does with the params (effective params, preflight), every
sampler on the same logits (transplant), and sampling parity (G-test on seeded samples)."""
