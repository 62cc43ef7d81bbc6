"""The command line: `app.py` builds the root command, one thin module per verb attaches to it.

Nothing outside this package imports it; every verb module parses flags, then makes one call into
the library below.
"""

from vlmserve.cli.app import main

__all__ = ["main"]
