"""Per-layer capture: architecture maps, forward hooks, the streaming trace writer, and model patches."""
