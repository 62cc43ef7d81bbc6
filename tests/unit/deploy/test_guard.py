"""A monitor step that raises is reported once per episode and never ends the loop."""

from __future__ import annotations

from vlmserve.deploy.guard import StepGuard


def test_a_failing_step_is_reported_once_and_its_recovery_once() -> None:
    said: list[str] = []
    guard = StepGuard(said.append)
    outcomes = []

    def broken() -> None:
        raise OSError(28, "No space left on device")

    for _ in range(50):  # 25 seconds of monitor passes
        outcomes.append(guard.run("save state", broken))
    assert outcomes == [False] * 50
    assert said == ["supervision step 'save state' failed: OSError: [Errno 28] No space left on device; "
                    "supervision goes on (reported once until it works again)"]  # fmt: skip
    assert guard.failing("save state") == "OSError: [Errno 28] No space left on device"
    assert guard.run("check replica 0", lambda: None) and len(said) == 1  # other steps are unaffected
    assert guard.run("save state", lambda: None)
    assert said[-1] == "supervision step 'save state' works again" and guard.failing("save state") is None


def test_a_new_failure_is_reported_and_a_broken_reporter_is_survived() -> None:
    said: list[str] = []
    guard = StepGuard(said.append)
    guard.run("check gateway", lambda: 1 / 0)
    guard.run("check gateway", lambda: {}["missing"])
    assert [line.split(":")[1].strip() for line in said] == ["ZeroDivisionError", "KeyError"]

    def deaf(_line: str) -> None:
        raise BrokenPipeError("the terminal is gone")

    assert StepGuard(deaf).run("check replica 1", lambda: 1 / 0) is False  # reporting fails too: still no raise
