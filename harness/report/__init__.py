"""What a run leaves for people and CI: summary.md, the HTML report (its plug-in sections), JUnit/Markdown/GitHub
outputs."""
