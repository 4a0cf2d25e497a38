"""What a run leaves for people and CI: summary.md, the HTML report, JUnit/Markdown/GitHub outputs, console tables."""
