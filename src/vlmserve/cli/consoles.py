"""Where the commands print: one rule for every command's rich Console.

At a terminal, rich's own width and wrapping. Redirected to a file or a pipe, rich would assume 80
columns: log lines would be hard-wrapped (a path or a URL split over two lines, where grep cannot
find it) and tables squeezed. There, lines are never wrapped and tables get `PIPED_WIDTH` columns.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

PIPED_WIDTH = 220
"""The width tables get when the output is not a terminal (wide enough for every table here)."""


def console(*, stderr: bool = False, **options: Any) -> Console:
    """A Console on stdout (or stderr) that follows the rule above; `options` are rich's own."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr, **options)
    return Console(stderr=stderr, width=PIPED_WIDTH, soft_wrap=True, **options)
