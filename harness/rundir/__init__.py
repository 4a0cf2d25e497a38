"""The run directory: its file names, run.json, the parquet tables with their column checks, the engine journals and
trace files; every command that reads or writes a run directory goes through here."""
