"""Several servers' Prometheus text pages (format 0.0.4) as one: each sample labelled with its source.

Why: a gateway serves its replicas' own /metrics pages at one address (`GET /admin/engine-metrics`),
and whoever reads that one page (the bench, an operator's Prometheus) must still tell the replicas'
series apart and get a page its parser takes. So:
- each sample gets a label naming its source, first in its label set; a label of that name the
  source already had is kept as `exported_<name>`, as Prometheus does on a clash;
- the lines of one family stay together under one HELP and one TYPE (the first source's), as the
  format requires; other comments (`# EOF` included) are dropped;
- a page that breaks the format, is not UTF-8 or is over `MAX_PAGE_BYTES` is refused whole
  (`PageRefused`) and its source named in a comment line: one bad source never spoils the merged page.

Label values are scanned as the format quotes them (`\\"` escapes; a `}` or `,` inside quotes is
part of the value). Pure text, no I/O: the gateway runs it off its event loop.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The exposition format's media type, as a page of it is served."""

GATEWAY_PATH = "/admin/engine-metrics"
"""Where a vlmserve gateway serves its replicas' pages merged (gateway/engine_metrics_admin.py; the bench reads it)."""

MAX_PAGE_BYTES = 8 << 20
"""One source's page: vLLM's is about 100-300 kB (mostly histogram buckets); a larger one is refused."""

LINES_PER_GIL_RELEASE = 128
"""Lines merged between two releases of the GIL (time.sleep(0), about 0.3 ms apart): in a thread beside an
event loop (the gateway's), a merge holding it would delay the loop by the 5 ms switch interval at a time
(benchmarks/engine_metrics_merge.py)."""

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*+"
_QUOTED = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'
_PAIR = rf"[ \t]*+[a-zA-Z_][a-zA-Z0-9_]*+[ \t]*+=[ \t]*+{_QUOTED}[ \t]*+"
_VALUE = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|Inf|inf|NaN|nan)"
_SAMPLE = re.compile(
    rf"({_NAME})(?:[ \t]*+\{{((?:{_PAIR},)*+(?:{_PAIR})?+[ \t]*+)\}})?[ \t]++({_VALUE})(?:[ \t]++(-?\d+))?[ \t]*"
)
"""A sample line as the format has it, checked whole in one match (possessive: no backtracking)."""
_PLAIN_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
_PLAIN = re.compile(rf"({_NAME})(?:\{{((?:{_PLAIN_PAIR}(?:,{_PLAIN_PAIR})*,?)?)\}})? ({_VALUE})(?: (-?\d+))?")
"""The common sample line (no escapes, single spaces), matched about twice as fast; any other goes to _SAMPLE."""
_LABEL = re.compile(rf"[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*({_QUOTED})[ \t]*,?")
_META = re.compile(rf"#[ \t]+(HELP|TYPE)[ \t]+({_NAME})(?:[ \t]+(.*))?")
_BLANKS = " \t"
_TYPES = frozenset(("counter", "gauge", "histogram", "summary", "untyped"))
"""The types format 0.0.4 knows (a TYPE line names one)."""
_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count", "_info", "_gsum", "_gcount")
"""A family's sample names beyond its own (histogram, summary, counter and info series)."""


class PageRefused(ValueError):
    """A source's page cannot be merged; the message says why (one line)."""


@dataclass
class _Family:
    help: str | None = None
    type: str | None = None
    samples: list[str] = field(default_factory=list)


def _quoted(value: str) -> str:
    """A label value as the format quotes it."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _renamed(inner: str, label: str) -> str:
    """A label set (checked already) with a label named `label` renamed `exported_<label>`."""
    pairs = ((match.group(1), match.group(2)) for match in _LABEL.finditer(inner))
    return ",".join(f"exported_{key}={value}" if key == label else f"{key}={value}" for key, value in pairs)


def _families(page: bytes | str, label: str, source: str) -> dict[str, _Family]:
    """One page's families, in order, each sample with `label="<source>"` put first."""
    if len(page) > MAX_PAGE_BYTES:
        raise PageRefused(f"page of {len(page):,} bytes, over the {MAX_PAGE_BYTES:,}-byte limit")
    try:
        text = page.decode() if isinstance(page, bytes) else page
    except UnicodeDecodeError:
        raise PageRefused("page is not UTF-8") from None
    ours = f"{label}={_quoted(source)}"
    families: dict[str, _Family] = {}
    current, family = "", _Family()
    for number, line in enumerate(text.splitlines(), start=1):
        if not number % LINES_PER_GIL_RELEASE:
            time.sleep(0)
        if not line or line[0] == "#" or line.isspace():
            meta = _META.fullmatch(line) if line.startswith("# ") else None
            if meta is not None:
                kind, current, rest = meta.groups()
                family = families.setdefault(current, _Family())
                if kind == "HELP":
                    family.help = rest or ""
                elif rest in _TYPES:
                    family.type = rest
                else:
                    raise PageRefused(f"line {number}: unknown metric type {str(rest)[:40]!r}")
            continue
        sample = _PLAIN.fullmatch(line) or _SAMPLE.fullmatch(line)
        if sample is None:
            raise PageRefused(f"line {number}: not a sample line: {line[:80]!r}")
        name, inner, value, timestamp = sample.groups()
        inner = inner.strip(_BLANKS) if inner else ""
        if label in inner:  # perhaps a label of ours already (or only the word in a value)
            inner = _renamed(inner, label)
        if not (name == current or (name.startswith(current) and name[len(current) :] in _SUFFIXES)):
            current = name  # a sample of no declared family: a family (untyped) of its own
            family = families.setdefault(current, _Family())
        labels = f"{ours},{inner}" if inner else ours
        family.samples.append(f"{name}{{{labels}}} {value} {timestamp}" if timestamp else f"{name}{{{labels}}} {value}")
    return families


def merge_pages(pages: Iterable[tuple[str, bytes | str]], label: str, failed: Iterable[tuple[str, str]] = ()) -> str:
    """The pages, (source, page) each, as one page whose samples carry `label="<source>"`; each of
    `failed`, (source, why), and each page refused, is left out and named in a `#` line."""
    merged: dict[str, _Family] = {}
    left_out = list(failed)
    for source, page in pages:
        try:
            families = _families(page, label, source)
        except PageRefused as refused:
            left_out.append((source, str(refused)))
            continue
        for name, family in families.items():
            into = merged.setdefault(name, _Family())
            into.help = into.help if into.help is not None else family.help
            into.type = into.type if into.type is not None else family.type
            into.samples.extend(family.samples)
    lines = [f"# {label} {_one_line(source)} left out: {_one_line(why)}" for source, why in left_out]
    for name, family in merged.items():
        if family.help is not None:
            lines.append(f"# HELP {name} {family.help}")
        if family.type is not None:
            lines.append(f"# TYPE {name} {family.type}")
        lines.extend(family.samples)
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    """Printable text on one line (a comment must not end early nor start a sample)."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)[:300]
