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


def check_listen_port(port: int, flag: str = "--port") -> None:
    """A port to listen on: 0 (the system picks a free one) or 1-65535. The socket layer would
    otherwise take a larger number modulo 65536 and listen somewhere the user did not ask for."""
    if not 0 <= port <= 65535:
        raise UserError(f"{flag} must be between 1 and 65535 (or 0 for a free port), got {port}")
