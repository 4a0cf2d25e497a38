"""Named models: prepared once into the cache from installed packages, never downloaded."""

from harness.models.catalog import MODELS, cache_root, eos_token_ids, prepare, resolve

__all__ = ["MODELS", "cache_root", "eos_token_ids", "prepare", "resolve"]
