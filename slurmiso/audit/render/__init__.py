"""The report dict as text, Markdown, HTML, JSON and CSV: presentation only, no figure is
computed here."""
