"""Running engines: plans, the executor that drives one worker process per engine, the worker itself, and the run
directory every result is written to as it arrives."""
