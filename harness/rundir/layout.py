"""The run directory's file names, in one place (harness.rundir.store writes run.json, harness.rundir.tables the
parquet files, each verdict family names its own table)."""

RUN_JSON = "run.json"
RESULTS = "results.parquet"  # one row per (engine, case): params, tokens, text, how it ended
STEPS = "steps.parquet"  # one row per generated token: chosen id and logprob, the top-k alternatives
BEAMS = "beams.parquet"  # one row per returned beam (beam-search cases only)
VERDICTS = "verdicts.parquet"  # the token verdicts (harness.verdicts.tokens), which baselines also read
NEAR_TIES = "near_ties.json"  # the noise near-ties were read with and each near-tie's layer check (tie_checks)
SUMMARY = "summary.md"
REPORT = "report.html"
ENGINES = "engines"  # engines/<name>/: each engine's journal, engine.json, traces
EXPLAIN = "explain"  # `parity explain`'s folder
TRANSPLANT = "transplant"  # `parity transplant`'s folder
