"""`parity transplant`: every engine's sampler on the reference's logits, so sampler differences show apart from
numerics."""
