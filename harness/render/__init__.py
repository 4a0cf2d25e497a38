"""Output building blocks shared by the verdict families and the reports: console tables and progress, Markdown, HTML
pieces, and a run directory read for a report."""
