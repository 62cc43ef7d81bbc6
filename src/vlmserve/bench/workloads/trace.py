"""trace: replay a JSONL trace with arrival times.

One JSON object per line: `timestamp` (milliseconds, as in the Mooncake traces) or
`arrival_s` (seconds), `input_length` and `output_length` (tokens), and optionally
`prompt` (sent as is) and `images` (a count of synthetic images). Lines that cannot be
read are skipped with a counted reason; arrival times are made relative to the first.

Every line is bounded before it is used (`bounded_read.TRACE_LINE`: bytes, nesting, values,
finite numbers) and so is each field (`FIELD_BOUNDS`): a line over a bound is one error naming
the file, the line and the bound, not a prompt of two billion tokens built until memory runs out.
LF, CRLF and CR all end a line.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

from vlmserve.bounded_read import TRACE_LINE, Refused, iter_lines, loads_json, too_long
from vlmserve.bench.workloads import Conversation, Turn, WorkloadContext, require_dataset_file
from vlmserve.bench.workloads.images import image_content, request_type, synthetic_image_url
from vlmserve.bench.workloads.text import fit_prompt
from vlmserve.errors import UserError


MAX_TRACE_TOKENS = 1 << 20
"""The longest prompt or answer a trace line may ask for: the largest context any model serves (1M)."""

MAX_TRACE_IMAGES = 64
"""The most synthetic images one trace line may ask for."""

FIELD_BOUNDS: dict[str, int] = {
    "input_length": MAX_TRACE_TOKENS, "output_length": MAX_TRACE_TOKENS, "images": MAX_TRACE_IMAGES}


def _arrival_s(entry: dict) -> float:
    if "arrival_s" in entry:
        seconds = float(entry["arrival_s"])
    elif "timestamp" in entry:
        seconds = float(entry["timestamp"]) / 1000.0
    else:
        raise ValueError("no timestamp or arrival_s")
    if not math.isfinite(seconds):
        raise ValueError("timestamp is not a finite number")
    return seconds


def _check_bounds(path: Path, line_number: int, values: dict[str, int]) -> None:
    """A field over its bound is the user's to fix: one line naming the file, line and bound."""
    for name, value in values.items():
        if value > FIELD_BOUNDS[name]:
            raise UserError(f"{path}: line {line_number}: {name} {value:,} is over the {FIELD_BOUNDS[name]:,} "
                            f"limit for a trace line; fix the trace")


def build(context: WorkloadContext, count: int) -> list[Conversation]:
    load = context.load
    path = require_dataset_file(load.dataset_path, "trace")
    skips: Counter[str] = Counter()
    conversations: list[Conversation] = []
    with path.open("rb") as handle:
        for line_number, raw in enumerate(iter_lines(handle, TRACE_LINE.max_bytes), start=1):
            if len(conversations) >= count:
                break
            if raw is None:
                raise UserError(f"{path}: line {line_number}: {too_long(TRACE_LINE)}; "
                                "fix the trace")
            line = raw.decode("utf-8", errors="replace")
            if not line.strip():
                continue
            try:
                entry = loads_json(line, TRACE_LINE)
                if not isinstance(entry, dict):
                    raise ValueError("not an object")
                arrival = _arrival_s(entry)
                input_len = int(entry.get("input_length", load.input_len))
                output_len = int(entry.get("output_length", load.output_len))
                images = int(entry.get("images", 0))
                if input_len < 1 or output_len < 1 or images < 0:
                    raise ValueError("lengths must be positive")
            except Refused as err:
                raise UserError(f"{path}: line {line_number}: {err}; fix the trace") from None
            except json.JSONDecodeError:
                skips["not JSON"] += 1
                continue
            except (ValueError, TypeError) as err:
                skips[str(err) if "timestamp" in str(err) or "positive" in str(err) else "bad field"] += 1
                continue
            _check_bounds(path, line_number, {"input_length": input_len, "output_length": output_len, "images": images})
            prompt = entry.get("prompt")
            if not isinstance(prompt, str):
                prompt, _ = fit_prompt(context.rng, context.counter, load.api, input_len)
            content: str | list = prompt
            if images:
                if load.api != "chat":
                    skips["images need --api chat"] += 1
                    continue
                urls = [synthetic_image_url(context.rng, load.image_size, load.image_format) for _ in range(images)]
                content = image_content(prompt, urls)
            conversations.append(
                Conversation(
                    conversation_id=f"trace-{line_number}",
                    workload="trace",
                    turns=[
                        Turn(
                            content=content,
                            max_tokens=output_len,
                            requested_prompt_tokens=input_len if "prompt" not in entry else None,
                            requested_output_tokens=output_len,
                            image_count=images,
                            request_type=request_type(images),
                        )
                    ],
                    arrival_s=arrival,
                )
            )
    if not conversations:
        reasons = ", ".join(f"{n} {why}" for why, n in skips.items()) or "empty file"
        raise UserError(f"--dataset-path {path}: no usable trace line ({reasons})")
    start = min(conversation.arrival_s or 0.0 for conversation in conversations)
    for conversation in conversations:
        conversation.arrival_s = (conversation.arrival_s or 0.0) - start
    conversations.sort(key=lambda conversation: conversation.arrival_s or 0.0)
    line = f"trace: {len(conversations)} requests over {conversations[-1].arrival_s:.1f} s from {path}"
    if skips:
        line += "; skipped " + ", ".join(f"{n} {why}" for why, n in skips.most_common())
    context.notices.append(line)
    return conversations
