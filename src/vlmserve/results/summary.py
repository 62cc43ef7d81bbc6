"""The typed run summary: what `summarize` computes, what the store keeps, what every reader reads.

The JSON a run writes (`--json-out`, `bench.json` in the store, sweep cells) is this model's
serialisation, with the same keys and nesting as docs/metrics.md describes: a field is written
when it was set (by `summarize` or by the producer that added a block afterwards: `meta`, `server`,
`simulation`, `warnings`), so older files load and dump back unchanged. Every block is a declared
model (the producers' blocks in results.blocks) that forbids keys it does not declare: a misspelled
key fails where it is written or read, instead of becoming a silent extra beside a field left at 0.

Readers name a figure (`"ttft_ms.p95"`, `"throughput.requests_per_s"`, `"goodput.requests_per_s"`)
and `FIGURES` maps each name to a typed accessor: there is no dotted-path walker over dicts, so a
renamed field breaks at one place and in mypy, not silently as a None in a report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject
from vlmserve.results.blocks import (
    DISTRIBUTION_STATS,
    ClientBlock,
    Distribution,
    PrefixCacheBlock,
    RepeatsBlock,
    RunMeta,
    ScalingBlock,
    ServerBlock,
    SimulationBlock,
)
from vlmserve.spec import REQUEST_TYPES

__all__ = ["DISTRIBUTION_STATS", "Distribution", "RunSummary", "FIGURES", "figure", "figure_value"]

LATENCY_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
"""The latency distributions every summary holds (docs/metrics.md defines each)."""


class _Block(BaseModel):
    """A part of the summary: an unknown key is an error (a misspelled key must not become a silent extra)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RequestCounts(_Block):
    total: int = 0
    completed: int = 0
    failed: int = 0
    failed_by_cause: dict[str, int] = Field(default_factory=dict)
    success_rate: float = 0.0
    warmup_excluded: int = 0


class Throughput(_Block):
    requests_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    input_tokens_per_s: float = 0.0
    total_tokens_per_s: float = 0.0
    chunks_per_s: float = 0.0


class TokenCounts(_Block):
    """Prompt and output token totals, requested vs actual, and the usage/tokenizer cross-check."""

    prompt_total: int = 0
    output_total: int = 0
    requested_prompt_mean: float | None = None
    actual_prompt_mean: float | None = None
    requested_output_mean: float | None = None
    actual_output_mean: float | None = None
    prompt_length_mismatches: int = 0
    output_length_mismatches: int = 0
    usage_missing: int = 0
    tokenizer_checked: int = 0
    usage_tokenizer_disagreements: int = 0
    usage_tokenizer_disagree: bool = False
    reasoning_total: int = 0
    requests_with_reasoning: int = 0
    tool_calls_total: int = 0
    images_total: int = 0


class SloCheck(_Block):
    bound_ms: float
    measured_ms: float | None = None
    met: bool = False


class Goodput(_Block):
    """Requests that met every SLO given, per second and as a fraction (None when no SLO was set)."""

    slo: dict[str, float] = Field(default_factory=dict)
    slo_text: str = ""
    good_requests: int = 0
    requests_per_s: float = 0.0
    fraction: float = 0.0
    checks: dict[str, SloCheck] = Field(default_factory=dict)
    all_met: bool = False


class GroupSummary(_Block):
    """Counts and latency distributions of one slice of a run (a turn, a workload)."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    ttft_ms: Distribution = Field(default_factory=Distribution)
    tpot_ms: Distribution = Field(default_factory=Distribution)
    itl_ms: Distribution = Field(default_factory=Distribution)
    e2e_ms: Distribution = Field(default_factory=Distribution)
    mean_prompt_tokens: float | None = None


class TtftBreakdown(_Block):
    """Mean parts of the client's TTFT in ms (results.breakdown defines each; they add up to client_ttft_ms)."""

    source: str = ""
    """"engine spans" (every part) or "client only" (upload and the rest)."""
    requests: int = 0
    without_engine_timings: int = 0
    client_ttft_ms: float | None = None
    upload_ms: float | None = None
    after_upload_ms: float | None = None
    frontend_ms: float | None = None
    http_ms: float | None = None
    engine_frontend_ms: float | None = None
    queue_ms: float | None = None
    prefill_ms: float | None = None
    engine_ttft_ms: float | None = None
    accounted: float | None = None
    """(upload + engine TTFT) / client TTFT: how much of what the client waited for the parts explain."""

    def part(self, name: str) -> float | None:
        """A part by its field name (`upload_ms`, `accounted`, ...)."""
        if name not in BREAKDOWN_FIGURES:
            raise KeyError(f"unknown breakdown part {name!r}; one of {', '.join(BREAKDOWN_FIGURES)}")
        value = getattr(self, name)
        return None if value is None else float(value)


BREAKDOWN_FIGURES: tuple[str, ...] = (
    "client_ttft_ms",
    "upload_ms",
    "frontend_ms",
    "http_ms",
    "engine_frontend_ms",
    "queue_ms",
    "prefill_ms",
    "engine_ttft_ms",
    "accounted",
)


class RateCheck(_Block):
    """A rate objective (`schema_valid>=0.99`): its lower bound, what was measured, the verdict."""

    bound: float
    measured: float | None = None
    met: bool = False


class FeatureSummary(_Block):
    """The feature workloads' figures (results.features defines each): valid rates and reasoning timings."""

    requested: list[str] = Field(default_factory=list)
    tool_choices: list[str] = Field(default_factory=list)
    structured_requests: int = 0
    schema_valid: int = 0
    schema_valid_rate: float | None = None
    tool_requests: int = 0
    tool_calls_judged: int = 0
    tool_calls_valid: int = 0
    tool_call_valid_rate: float | None = None
    answered_without_tool_call: int = 0
    invalid_reasons: dict[str, int] = Field(default_factory=dict)
    """'structured: not JSON', 'tools: schema', ... → count (most frequent first)."""
    thinking_requests: int = 0
    requests_with_reasoning: int = 0
    reasoning_tokens: Distribution = Field(default_factory=Distribution)
    """Tokens (not ms), per thinking request."""
    answer_tokens: Distribution = Field(default_factory=Distribution)
    """Tokens (not ms): output tokens minus reasoning tokens, per thinking request."""
    time_to_first_reasoning_ms: Distribution = Field(default_factory=Distribution)
    time_to_first_answer_ms: Distribution = Field(default_factory=Distribution)
    slo: dict[str, RateCheck] = Field(default_factory=dict)
    slo_met: bool | None = None
    """Every rate objective met; None when none was given."""


FEATURE_DISTRIBUTIONS: tuple[str, ...] = (
    "reasoning_tokens",
    "answer_tokens",
    "time_to_first_reasoning_ms",
    "time_to_first_answer_ms",
)


class TypeSummary(GroupSummary):
    """One request type's figures: a GroupSummary plus request size, TTFT breakdown and goodput."""

    request_bytes_mean: float | None = None
    breakdown: TtftBreakdown | None = None
    goodput: Goodput | None = None
    """Against the run's SLO with this type's own objectives on top; None when no objective applies."""
    by_repeat: dict[str, TypeSummary] | None = None
    """Image types: "first" (an image new to the run) and "repeat" (every image sent before)."""


class AdapterSummary(GroupSummary):
    """One LoRA adapter's figures (`bench --lora-adapters`; results.adapters defines the first-use ones)."""

    share: float = 0.0
    """Its share of the measured requests."""
    first_use_ttft_ms: float | None = None
    """TTFT of its first request in the run (warm-up included): the engine may load it then."""
    warm_ttft_p50_ms: float | None = None
    """TTFT p50 of its later measured requests."""
    first_use_penalty_ms: float | None = None
    """first_use_ttft_ms - warm_ttft_p50_ms: what its first use cost (load, slot) beyond a warm request."""


class RunSummary(_Block):
    """One run's figures (measured or simulated) and the blocks producers attach to them."""

    requests: RequestCounts = Field(default_factory=RequestCounts)
    duration_s: float = 0.0
    throughput: Throughput = Field(default_factory=Throughput)
    ttft_ms: Distribution = Field(default_factory=Distribution)
    tpot_ms: Distribution = Field(default_factory=Distribution)
    itl_ms: Distribution = Field(default_factory=Distribution)
    e2e_ms: Distribution = Field(default_factory=Distribution)
    tokens: TokenCounts = Field(default_factory=TokenCounts)
    goodput: Goodput | None = None
    client: ClientBlock = Field(default_factory=ClientBlock)
    """Send lag, offered vs achieved rate, client CPU, and whether the client limited the run."""
    per_turn: dict[str, GroupSummary] | None = None
    per_workload: dict[str, GroupSummary] | None = None
    by_type: dict[str, TypeSummary] | None = None
    """Per request type (text, image, multi-image, video, audio): latencies, breakdown, goodput."""
    by_adapter: dict[str, AdapterSummary] | None = None
    """Per LoRA adapter (`base`: the base model), with its first-use penalty; None without --lora-adapters."""
    features: FeatureSummary | None = None
    """Valid rates and reasoning timings of the feature workloads (`--features`); None without them."""
    meta: RunMeta = Field(default_factory=RunMeta)
    """run_id, label, target, model, server_version, load_spec, deployment, started_at, simulated."""
    server: ServerBlock | None = None
    """Scraped /metrics deltas of the endpoint (bench.scrape)."""
    simulation: SimulationBlock | None = None
    """Engine-side totals of a simulated run (plan.simulate)."""
    prefix_cache: PrefixCacheBlock | None = None
    """Expected vs measured prefix-cache hits (bench.prefix_cache)."""
    repeats: RepeatsBlock | None = None
    """Per-repeat rows and intervals of a `--repeat N` run (bench.repeats)."""
    scaling: ScalingBlock | None = None
    """`--load-shape` runs: SLO attainment per window and across each scale-up and scale-down (bench.scale_events)."""
    warnings: list[str] | None = None
    """Post-run steps that failed (bench.post_run): the figures are complete, something around them is not."""

    @classmethod
    def from_partial(cls, data: dict[str, object]) -> RunSummary:
        """A summary from another tool's figures (`runs import`): values it lacks (None) stay unset."""

        def present(node: object) -> object:
            if isinstance(node, dict):
                return {key: present(value) for key, value in node.items() if value is not None}
            return node

        return cls.model_validate(present(data))

    def latency(self, metric: str) -> Distribution:
        """`ttft_ms`, `tpot_ms`, `itl_ms` or `e2e_ms`."""
        if metric not in LATENCY_METRICS:
            raise KeyError(f"unknown latency metric {metric!r}; one of {', '.join(LATENCY_METRICS)}")
        distribution: Distribution = getattr(self, metric)
        return distribution

    @property
    def simulated(self) -> bool:
        return self.meta.simulated

    @property
    def client_limited(self) -> bool:
        return self.client.limited

    def figure(self, name: str) -> float | None:
        """A headline figure by its name in `FIGURES`; None when this run has no value for it."""
        return figure(name).read(self)

    def to_dict(self) -> JSONObject:
        """The JSON document (same keys and nesting as before the model existed).

        Fields are written when set, or when a producer filled a default block in place
        (`result.meta.run_id = …`), so nothing a producer recorded is lost; inside a block, only
        the keys a producer set are written.
        """
        data: JSONObject = self.model_dump(mode="json", exclude_unset=True)
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if name not in data and value != info.get_default(call_default_factory=True):
                data[name] = (
                    value.model_dump(mode="json", exclude_unset=True)
                    if isinstance(value, BaseModel)
                    else (self.model_dump(mode="json", include={name})[name])
                )
        first: JSONObject = {key: data.pop(key) for key in ("meta", "warnings") if key in data}  # reads top-down
        return {**first, **data}


def read_summary(data: object, where: str) -> RunSummary:
    """A summary document someone stored or handed in (a sweep manifest, a `--json-out` file, the
    history): a key no block declares, or a value of the wrong type, is one UserError line naming it."""
    try:
        return RunSummary.model_validate(data)
    except ValidationError as err:
        problem = err.errors()[0]
        place = ".".join(str(part) for part in problem["loc"]) or "the document"
        raise UserError(f"{where} does not read as a run summary ({place}: {problem['msg']})") from None


@dataclass(frozen=True)
class Figure:
    """One named figure of a run: how to read it, its unit, and which direction is better."""

    name: str
    label: str
    unit: str
    read: Callable[[RunSummary], float | None]
    lower_is_better: bool


def _latency_figure(metric: str, stat: str) -> Figure:
    label = f"{metric.removesuffix('_ms').upper()} {stat}"
    return Figure(f"{metric}.{stat}", label, "ms", lambda summary: summary.latency(metric).stat(stat), True)


def _goodput_rps(summary: RunSummary) -> float | None:
    return None if summary.goodput is None else summary.goodput.requests_per_s


def _goodput_fraction(summary: RunSummary) -> float | None:
    return None if summary.goodput is None else summary.goodput.fraction


def _feature_rate(name: str) -> Callable[[RunSummary], float | None]:
    return lambda summary: None if summary.features is None else getattr(summary.features, name)


def _feature_figures() -> list[Figure]:
    """`features.schema_valid_rate`, `features.tool_call_valid_rate`, `features.time_to_first_answer_ms.p95`, ..."""
    figures = [
        Figure("features.schema_valid_rate", "schema-valid rate", "", _feature_rate("schema_valid_rate"), False),
        Figure("features.tool_call_valid_rate", "valid tool-call rate", "", _feature_rate("tool_call_valid_rate"), False),
    ]
    for name in FEATURE_DISTRIBUTIONS:
        unit = "ms" if name.endswith("_ms") else "tok"
        for stat in ("p50", "p90", "p95", "p99", "mean"):

            def read(summary: RunSummary, name: str = name, stat: str = stat) -> float | None:
                return None if summary.features is None else getattr(summary.features, name).stat(stat)

            label = f"{name.removesuffix('_ms').replace('_', ' ')} {stat}"
            figures.append(Figure(f"features.{name}.{stat}", label, unit, read, True))  # fewer tokens cost less
    return figures


TYPE_FIGURE_TYPES: tuple[str, ...] = REQUEST_TYPES
"""Request types with registered figures."""

REPEAT_FIGURE_TYPES: tuple[str, ...] = ("image", "multi-image")


def _type_block(summary: RunSummary, request_type: str, split: str | None) -> TypeSummary | None:
    block = (summary.by_type or {}).get(request_type)
    if block is not None and split is not None:
        block = (block.by_repeat or {}).get(split)
    return block


def _type_figures(request_type: str, split: str | None) -> list[Figure]:
    """`by_type.image.ttft_ms.p95`, `by_type.image.repeat.breakdown.upload_ms`, `by_type.text.goodput.fraction`, ..."""
    prefix = f"by_type.{request_type}" + (f".{split}" if split else "")
    shown = f"{request_type}{' ' + split if split else ''}"

    def latency(metric: str, stat: str) -> Figure:
        def read(summary: RunSummary) -> float | None:
            block = _type_block(summary, request_type, split)
            return None if block is None else getattr(block, metric).stat(stat)

        return Figure(f"{prefix}.{metric}.{stat}", f"{shown} {metric.removesuffix('_ms').upper()} {stat}", "ms", read, True)

    def part(name: str) -> Figure:
        def read(summary: RunSummary) -> float | None:
            block = _type_block(summary, request_type, split)
            return None if block is None or block.breakdown is None else block.breakdown.part(name)

        unit = "" if name == "accounted" else "ms"
        return Figure(
            f"{prefix}.breakdown.{name}", f"{shown} {name.removesuffix('_ms').replace('_', ' ')}", unit, read, name != "accounted"
        )

    def count(name: str) -> Figure:
        def read(summary: RunSummary) -> float | None:
            block = _type_block(summary, request_type, split)
            return None if block is None else float(getattr(block, name))

        return Figure(f"{prefix}.{name}", f"{shown} {name} requests", "", read, name == "failed")

    def good(name: str) -> Figure:
        def read(summary: RunSummary) -> float | None:
            block = _type_block(summary, request_type, split)
            return None if block is None or block.goodput is None else float(getattr(block.goodput, name))

        unit = "req/s" if name == "requests_per_s" else ""
        return Figure(f"{prefix}.goodput.{name}", f"{shown} goodput {name.replace('_', ' ')}", unit, read, False)

    return [
        *(latency(metric, stat) for metric in LATENCY_METRICS for stat in DISTRIBUTION_STATS),
        *(part(name) for name in BREAKDOWN_FIGURES),
        *(count(name) for name in ("requests", "completed", "failed")),
        *(good(name) for name in ("requests_per_s", "fraction")),
    ]


FIGURES: dict[str, Figure] = {
    figure.name: figure
    for figure in [
        *(_latency_figure(metric, stat) for metric in LATENCY_METRICS for stat in DISTRIBUTION_STATS),
        Figure("throughput.requests_per_s", "requests/s", "req/s", lambda s: s.throughput.requests_per_s, False),
        Figure("throughput.output_tokens_per_s", "output tok/s", "tok/s", lambda s: s.throughput.output_tokens_per_s, False),
        Figure("throughput.input_tokens_per_s", "input tok/s", "tok/s", lambda s: s.throughput.input_tokens_per_s, False),
        Figure("throughput.total_tokens_per_s", "total tok/s", "tok/s", lambda s: s.throughput.total_tokens_per_s, False),
        Figure("goodput.requests_per_s", "goodput req/s", "req/s", _goodput_rps, False),
        Figure("goodput.fraction", "goodput fraction", "", _goodput_fraction, False),
        Figure("requests.success_rate", "success rate", "", lambda s: s.requests.success_rate, False),
        Figure("requests.failed", "failed requests", "", lambda s: float(s.requests.failed), True),
        Figure("requests.completed", "completed requests", "", lambda s: float(s.requests.completed), False),
        Figure("requests.total", "requests", "", lambda s: float(s.requests.total), False),
        Figure("duration_s", "duration", "s", lambda s: s.duration_s, True),
        Figure("tokens.prompt_total", "prompt tokens", "tok", lambda s: float(s.tokens.prompt_total), False),
        Figure("tokens.output_total", "output tokens", "tok", lambda s: float(s.tokens.output_total), False),
        Figure("tokens.actual_prompt_mean", "mean prompt tokens", "tok", lambda s: s.tokens.actual_prompt_mean, False),
        Figure("tokens.actual_output_mean", "mean output tokens", "tok", lambda s: s.tokens.actual_output_mean, False),
        Figure("tokens.images_total", "images", "", lambda s: float(s.tokens.images_total), False),
        *_feature_figures(),
        *(item for kind in TYPE_FIGURE_TYPES for item in _type_figures(kind, None)),
        *(item for kind in REPEAT_FIGURE_TYPES for split in ("first", "repeat") for item in _type_figures(kind, split)),
    ]
}
"""Every figure a report, comparison, sweep ranking or interval may name, by its name."""


def figure(name: str) -> Figure:
    """The figure called `name` (KeyError naming the known ones otherwise)."""
    try:
        return FIGURES[name]
    except KeyError:
        known = ", ".join(key for key in FIGURES if not key.startswith("by_type."))
        raise KeyError(
            f"unknown figure {name!r}; known: {known}, and by_type.<{'|'.join(TYPE_FIGURE_TYPES)}>[.first|.repeat]"
            ".<any of those latency, breakdown.<part>, requests, goodput figures>"
        ) from None


def figure_value(summary: RunSummary | None, name: str) -> float | None:
    """`summary`'s value for the figure `name`; None without a summary or without a value."""
    return None if summary is None else figure(name).read(summary)
