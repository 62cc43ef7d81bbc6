"""Reports of runs and sweeps: console, HTML (offline), Markdown, and compare."""
