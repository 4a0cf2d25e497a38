"""Each engine's own sampling code, called without weights: effective params and the sampler transplant."""
