"""Where a request's time to first token goes: upload, frontend, queue, prefill.

The question an image workload asks is "where does my image request's time go". The parts
come from two clocks, each used only for differences on itself:

- the client's: TTFT (send to first content chunk) and upload (send to the request's last
  byte handed to the kernel, `RequestRecord.upload_s`);
- the engine's, from its per-request trace span: engine TTFT (the request's arrival in vLLM's
  input processing to its first token), queue (waiting in the scheduler), prefill (first
  scheduled to first token: the vision encoder and the prompt's forward pass).

Per request, with every part measured, they add up to the client's TTFT exactly:

    client TTFT = upload + frontend + queue + prefill
    frontend    = client TTFT − upload − queue − prefill
                = http + engine_frontend
    http            = client TTFT − upload − engine TTFT   (outside the engine's clock: the
                      server reading and parsing the body, chat template and media decoding before
                      vLLM stamps the arrival, the first chunk's way back; should be small)
    engine_frontend = engine TTFT − queue − prefill        (inside it: input and image processing,
                      the hand-over to the engine core, the first token's way out)

A summary reports the means of the parts over the requests that have all of them (means add
up, percentiles do not), and `accounted` = (upload + engine TTFT) / client TTFT: near 1 when the
engine's clock covers what the client waited for (within 10 % expected on a real engine).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vlmserve.results.records import RequestRecord

PARTS: tuple[str, ...] = ("upload_ms", "frontend_ms", "queue_ms", "prefill_ms")
"""The stacked parts of client TTFT, in the order a request meets them."""


@dataclass(frozen=True)
class RequestBreakdown:
    """One request's parts in seconds (each engine part None when the engine gave no timings)."""

    client_ttft_s: float
    upload_s: float
    engine_ttft_s: float | None
    queue_s: float | None
    prefill_s: float | None

    @property
    def complete(self) -> bool:
        return self.engine_ttft_s is not None and self.queue_s is not None and self.prefill_s is not None

    @property
    def http_s(self) -> float | None:
        """Client TTFT outside upload and the engine's own TTFT."""
        if self.engine_ttft_s is None:
            return None
        return self.client_ttft_s - self.upload_s - self.engine_ttft_s

    @property
    def engine_frontend_s(self) -> float | None:
        """Engine TTFT outside queue and prefill."""
        if not self.complete:
            return None
        assert self.engine_ttft_s is not None and self.queue_s is not None and self.prefill_s is not None
        return self.engine_ttft_s - self.queue_s - self.prefill_s

    @property
    def frontend_s(self) -> float | None:
        """Client TTFT outside upload, queue and prefill."""
        if self.queue_s is None or self.prefill_s is None:
            return None
        return self.client_ttft_s - self.upload_s - self.queue_s - self.prefill_s


def request_breakdown(record: RequestRecord) -> RequestBreakdown | None:
    """The parts of one answered request; None without a client TTFT or an upload time."""
    if not record.ok or record.ttft_s is None or record.upload_s is None:
        return None
    return RequestBreakdown(record.ttft_s, record.upload_s, record.engine_ttft_s, record.engine_queue_s, record.engine_prefill_s)


def _mean_ms(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return sum(present) / len(present) * 1000.0 if present else None


def ttft_breakdown(records: Sequence[RequestRecord]) -> dict[str, object] | None:
    """Mean parts (ms) of client TTFT over the answered requests; None when none has an upload time.

    With engine timings the means cover only the requests that have all of them (`requests`),
    so the parts add up to `client_ttft_ms`; without any, only upload and the rest
    (`after_upload_ms` = client TTFT − upload) are given and `source` says so.
    """
    parts = [part for record in records if (part := request_breakdown(record)) is not None]
    if not parts:
        return None
    complete = [part for part in parts if part.complete]
    if complete:
        client = _mean_ms([part.client_ttft_s for part in complete])
        upload = _mean_ms([part.upload_s for part in complete])
        engine = _mean_ms([part.engine_ttft_s for part in complete])
        assert client is not None and upload is not None and engine is not None
        return {
            "source": "engine spans",
            "requests": len(complete),
            "without_engine_timings": len(parts) - len(complete),
            "client_ttft_ms": client,
            "upload_ms": upload,
            "after_upload_ms": client - upload,
            "frontend_ms": _mean_ms([part.frontend_s for part in complete]),
            "http_ms": _mean_ms([part.http_s for part in complete]),
            "engine_frontend_ms": _mean_ms([part.engine_frontend_s for part in complete]),
            "queue_ms": _mean_ms([part.queue_s for part in complete]),
            "prefill_ms": _mean_ms([part.prefill_s for part in complete]),
            "engine_ttft_ms": engine,
            "accounted": (upload + engine) / client if client > 0 else None,
        }
    client = _mean_ms([part.client_ttft_s for part in parts])
    upload = _mean_ms([part.upload_s for part in parts])
    assert client is not None and upload is not None
    return {
        "source": "client only",
        "requests": len(parts),
        "without_engine_timings": len(parts),
        "client_ttft_ms": client,
        "upload_ms": upload,
        "after_upload_ms": client - upload,
    }
