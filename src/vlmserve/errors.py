"""The one exception type that reaches the user as a one-line message.

Anything the user can fix (a bad flag, a missing file, a port in use) is raised as
`UserError`; the CLI prints `error: <message>` and exits non-zero without a traceback.
Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the message says what to do next."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message
