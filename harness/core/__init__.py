"""The vocabulary every layer shares, the adapters included: the types an engine takes and returns, the canonical
params, capture points, errors, paths, child processes, numerics and plug-in lists."""
