"""The verdict rules: per-step diffs, token, beam, sampling, invariance and drift verdicts in plain words; baselines and
the CI gate."""
