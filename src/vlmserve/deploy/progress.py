"""Is a replica that answers /health still making progress? Read from its own engine metrics.

vLLM's API server answers /health from its own process even when the engine core behind it
is stuck (a deadlocked scheduler, a wedged GPU kernel): the classic liveness check passes
while every request waits for ever. The engine's Prometheus counters tell the truth: with
requests waiting or running, a working engine adds prompt or generation tokens every step.
So a replica whose `vllm:num_requests_waiting` + `vllm:num_requests_running` stay above zero
while `vllm:prompt_tokens_total` and `vllm:generation_tokens_total` stand still for the whole
window has stalled. (vLLM counts a request's prompt tokens when its prefill completes, so the
window must be longer than the longest prefill the deployment serves; see LivenessOptions.)
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmserve.observe.queries import VLLM_GENERATION_TOKENS, VLLM_PROMPT_TOKENS, VLLM_RUNNING, VLLM_WAITING

_WANTED = (VLLM_WAITING, VLLM_RUNNING, VLLM_PROMPT_TOKENS, VLLM_GENERATION_TOKENS)
_PREFIXES = tuple(name + end for name in _WANTED for end in ("{", " "))


@dataclass(frozen=True)
class EngineProgress:
    """One reading of an engine's queue and token counters (summed over label sets)."""

    waiting: float
    running: float
    tokens: float
    """Prompt plus generation tokens processed since the engine started."""

    @property
    def busy(self) -> bool:
        return self.waiting > 0 or self.running > 0


def parse_progress(metrics_text: str) -> EngineProgress | None:
    """The reading in a Prometheus page, or None when the page has none of the token counters
    (an engine that does not export them cannot be judged this way)."""
    values = dict.fromkeys(_WANTED, 0.0)
    seen_counter = False
    for line in metrics_text.splitlines():
        if not line.startswith(_PREFIXES):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if value != value or value in (float("inf"), float("-inf")):
            continue  # NaN or infinite: not a reading
        values[name] += value
        seen_counter = seen_counter or name in (VLLM_PROMPT_TOKENS, VLLM_GENERATION_TOKENS)
    if not seen_counter:
        return None
    return EngineProgress(
        waiting=values[VLLM_WAITING],
        running=values[VLLM_RUNNING],
        tokens=values[VLLM_PROMPT_TOKENS] + values[VLLM_GENERATION_TOKENS],
    )


class StallJudge:
    """Says when a busy engine's token counters have stood still for `window_s`."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._tokens: float | None = None
        self._still_since: float | None = None

    def reset(self) -> None:
        """Forget what was seen (a restart, or a verdict acted on)."""
        self._tokens = None
        self._still_since = None

    def observe(self, reading: EngineProgress, now: float) -> str | None:
        """Take one reading; a one-line reason once the engine is busy and still for the window."""
        if not reading.busy or self._tokens is None or reading.tokens != self._tokens:
            self._tokens = reading.tokens
            self._still_since = now if reading.busy else None
            return None
        if self._still_since is None:
            self._still_since = now
        still_for = now - self._still_since
        if still_for < self.window_s:
            return None
        return (
            f"stalled: {reading.waiting:g} waiting and {reading.running:g} running, "
            f"no prompt or generation token in {still_for:.0f} s while /health answers"
        )
