"""Where the project lives on disk."""

from pathlib import Path

# The project checkout: workers and engine environments run from it (a relative `python:` path resolves here).
PROJECT_ROOT = Path(__file__).resolve().parents[2]
