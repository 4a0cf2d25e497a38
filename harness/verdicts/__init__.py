"""Verdict families (harness.verdicts.family): each judges one aspect of a run, owns a table of the run directory and
renders itself in the console, summary.md and the HTML report."""
