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
from dataclasses import dataclass
from pathlib import Path

from vlmserve.bench.workloads import Conversation, Turn, WorkloadContext, require_dataset_file
from vlmserve.bench.workloads.images import image_content, request_type, synthetic_image_url
from vlmserve.bench.workloads.text import fit_prompt
from vlmserve.bounded_read import TRACE_LINE, Refused, iter_lines, loads_json, too_long
from vlmserve.errors import UserError
from vlmserve.spec import LoadSpec

MAX_TRACE_TOKENS = 1 << 20
"""The longest prompt or answer a trace line may ask for: the largest context any model serves (1M)."""

MAX_TRACE_IMAGES = 64
"""The most synthetic images one trace line may ask for."""

FIELD_BOUNDS: dict[str, int] = {"input_length": MAX_TRACE_TOKENS, "output_length": MAX_TRACE_TOKENS, "images": MAX_TRACE_IMAGES}


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
            raise UserError(
                f"{path}: line {line_number}: {name} {value:,} is over the {FIELD_BOUNDS[name]:,} "
                f"limit for a trace line; fix the trace"
            )


@dataclass(frozen=True)
class _TraceLine:
    """One usable trace line: its fields read, checked and within `FIELD_BOUNDS`."""

    line_number: int
    entry: dict
    arrival_s: float
    input_len: int
    output_len: int
    images: int


def _read_line(path: Path, line_number: int, line: str, load: LoadSpec) -> _TraceLine | str:
    """The line's fields, or the counted reason it is skipped; a line over a bound is the user's error."""
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
        return "not JSON"
    except (ValueError, TypeError) as err:
        return str(err) if "timestamp" in str(err) or "positive" in str(err) else "bad field"
    _check_bounds(path, line_number, {"input_length": input_len, "output_length": output_len, "images": images})
    return _TraceLine(line_number, entry, arrival, input_len, output_len, images)


def _conversation(context: WorkloadContext, line: _TraceLine) -> Conversation | str:
    """The one-turn conversation a line asks for (its prompt, or a fitted one), or why it cannot be sent."""
    load = context.load
    prompt = line.entry.get("prompt")
    if not isinstance(prompt, str):  # fitted before the API check, so the RNG advances as it always has
        prompt, _ = fit_prompt(context.rng, context.counter, load.api, line.input_len)
    content: str | list = prompt
    if line.images:
        if load.api != "chat":
            return "images need --api chat"
        urls = [synthetic_image_url(context.rng, load.image_size, load.image_format) for _ in range(line.images)]
        content = image_content(prompt, urls)
    turn = Turn(
        content=content,
        max_tokens=line.output_len,
        requested_prompt_tokens=line.input_len if "prompt" not in line.entry else None,
        requested_output_tokens=line.output_len,
        image_count=line.images,
        request_type=request_type(line.images),
    )
    return Conversation(conversation_id=f"trace-{line.line_number}", workload="trace", turns=[turn], arrival_s=line.arrival_s)


def _rebased(context: WorkloadContext, path: Path, conversations: list[Conversation], skips: Counter[str]) -> list[Conversation]:
    """Arrivals made relative to the first and sorted, with one notice line; no usable line is an error."""
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


def build(context: WorkloadContext, count: int) -> list[Conversation]:
    """The trace's first `count` usable lines as timed conversations; unreadable lines are counted, not fatal."""
    path = require_dataset_file(context.load.dataset_path, "trace")
    skips: Counter[str] = Counter()
    conversations: list[Conversation] = []
    with path.open("rb") as handle:
        for line_number, raw in enumerate(iter_lines(handle, TRACE_LINE.max_bytes), start=1):
            if len(conversations) >= count:
                break
            if raw is None:
                raise UserError(f"{path}: line {line_number}: {too_long(TRACE_LINE)}; fix the trace")
            line = raw.decode("utf-8", errors="replace")
            if not line.strip():
                continue
            parsed = _read_line(path, line_number, line, context.load)
            made = parsed if isinstance(parsed, str) else _conversation(context, parsed)
            if isinstance(made, str):
                skips[made] += 1
            else:
                conversations.append(made)
    return _rebased(context, path, conversations, skips)
