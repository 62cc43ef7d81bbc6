"""Per-adapter figures of a many-adapter run (`bench --lora-adapters`), first-use penalty included.

An engine loads a LoRA adapter when a request first needs it (and again after evicting it), so an
adapter's first request in a run may carry a load the others do not. Each adapter's block is its
latencies (as a GroupSummary) plus: the TTFT of its first request (warm-up included: if the warm-up
paid for the load, the run says so by showing no penalty), the p50 TTFT of its later measured
requests, and the difference, the first-use penalty. One request is one sample: read the penalty
across adapters (the console shows its median), not as one adapter's exact load time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vlmserve.results.metrics import _group_summary
from vlmserve.results.records import RequestRecord

BASE_MODEL = "base"
"""The by_adapter key of requests sent to the base model."""


def per_adapter(records: Sequence[RequestRecord], counted: Sequence[RequestRecord]) -> dict[str, dict[str, object]]:
    """`by_adapter`: one block per adapter (and `base`), most requested first."""
    firsts: dict[str, RequestRecord] = {}
    for record in sorted(records, key=lambda item: item.sent_at_s):
        firsts.setdefault(record.adapter or BASE_MODEL, record)
    groups: dict[str, list[RequestRecord]] = {}
    for record in counted:
        groups.setdefault(record.adapter or BASE_MODEL, []).append(record)
    blocks: dict[str, dict[str, object]] = {}
    for name, chosen in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        first = firsts[name]
        first_ttft = first.ttft_s * 1000.0 if first.ok and first.ttft_s is not None else None
        warm = [r.ttft_s for r in chosen if r is not first and r.ok and r.ttft_s is not None]
        warm_p50 = float(np.percentile(warm, 50)) * 1000.0 if warm else None
        blocks[name] = {
            **_group_summary(chosen),
            "share": len(chosen) / len(counted) if counted else 0.0,
            "first_use_ttft_ms": first_ttft,
            "warm_ttft_p50_ms": warm_p50,
            "first_use_penalty_ms": first_ttft - warm_p50 if first_ttft is not None and warm_p50 is not None else None,
        }
    return blocks
