"""Comparing engines' results: per-step diffs, verdicts in plain words, baselines and the CI gate."""
