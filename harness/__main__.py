"""Allow `python -m harness`."""
from harness.cli import app

app()
