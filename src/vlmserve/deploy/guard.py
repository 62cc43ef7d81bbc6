"""One step of a supervision loop that may fail without ending the loop.

The supervisor's monitor thread is the only thing that restarts crashed processes: if an
exception ever escaped it, the thread would end and nothing would be restarted again, silently
(a full disk did exactly that). So every step runs through a `StepGuard`: an exception is
reported in one line, with its traceback printed once to stderr, and the loop goes on with
the next step. A step that keeps failing the same way is reported once, not on every pass (a
pass runs twice a second), and once more when it works again.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable


class StepGuard:
    """Runs named steps; `run` returns False (after reporting) instead of raising."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._failing: dict[str, str] = {}
        """step -> the failure last reported for it, while it keeps failing."""

    def failing(self, step: str) -> str | None:
        """The failure `step` is stuck in, or None when its last run succeeded."""
        return self._failing.get(step)

    def run(self, step: str, action: Callable[[], object]) -> bool:
        """Run `action`; True when it returned, False when it raised (reported once per episode)."""
        try:
            action()
        except Exception as problem:  # noqa: BLE001 - the point: nothing ends supervision
            what = f"{type(problem).__name__}: {problem}"
            if self._failing.get(step) != what:
                self._failing[step] = what
                self._tell(
                    f"supervision step '{step}' failed: {what}; supervision goes on (reported once until it works again)",
                    traceback.format_exc(),
                )
            return False
        if self._failing.pop(step, None) is not None:
            self._tell(f"supervision step '{step}' works again", None)
        return True

    def _tell(self, line: str, details: str | None) -> None:
        try:
            self._say(line)
        except Exception:  # noqa: BLE001, S110 - reporting must not be a new way to fail
            pass
        if details:
            try:
                sys.stderr.write(details)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
