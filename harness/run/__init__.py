"""`parity run` and `--resume`: a scenario through the executor, its results judged by every verdict family, its run
directory completed."""
