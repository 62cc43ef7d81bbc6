"""Search GPU type × TP × replicas × max-num-seqs for the cheapest deployment meeting an SLO.

Every candidate is checked for memory first (a model that does not fit is out, with the
GB it lacks), then simulated at the target load and judged against the SLO (and, for
open-loop load, against keeping up with the offered rate). The winner is the cheapest
that passes; every other candidate carries the reason it lost.

With `prune=True` (the default) replica counts are tried in ascending order per
(GPU, TP, max-num-seqs) and the search stops adding replicas once one count passes:
more replicas of the same shape can only cost more. Pruned candidates are listed as such.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from vlmserve.errors import UserError
from vlmserve.hardware.calibration import Calibration
from vlmserve.hardware.gpus import get_gpu
from vlmserve.hardware.models import load_model
from vlmserve.hardware.setup import FRONTEND_PER_IMAGE_MS, FRONTEND_PER_MEGAPIXEL_MS, PlanSetup
from vlmserve.plan.explain import frontend_is_limit
from vlmserve.plan.simulate import simulate_run
from vlmserve.results.records import RequestRecord
from vlmserve.results.run import RunResult
from vlmserve.results.summary import RunSummary
from vlmserve.sched.frontend import FrontendConfig
from vlmserve.spec import SLO, LoadSpec

QUEUE_GROWTH_FACTOR = 2.0
QUEUE_GROWTH_MIN_S = 0.5
"""Open loop: overloaded when the last tenth of requests waits for its first token more than
twice as long (and 0.5 s longer) as the first tenth — the queue grows without bound."""


@dataclass
class SearchSpace:
    model: str
    gpus: list[str]
    tps: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    replicas: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 6, 8])
    max_num_seqs: list[int] = field(default_factory=lambda: [64, 128, 256])
    max_gpus: int = 8
    weight_dtype: str | None = None
    kv_dtype: str = "bf16"
    max_num_batched_tokens: int | None = None
    api_server_counts: list[int] = field(default_factory=lambda: [1])
    """vLLM --api-server-count values to try: CPU processes, free in GPU cost; fewer win at equal cost."""
    frontend: FrontendConfig = field(
        default_factory=lambda: FrontendConfig(per_image_ms=FRONTEND_PER_IMAGE_MS, per_megapixel_ms=FRONTEND_PER_MEGAPIXEL_MS)
    )
    """Preprocessing costs and cache of every candidate (its api_server_count is the candidate's)."""


@dataclass
class Candidate:
    gpu: str
    tp: int
    replicas: int
    max_num_seqs: int
    num_gpus: int
    cost_per_hour: float | None
    status: str = "pending"
    """'meets', 'misses', 'does not fit', 'over budget', 'pruned'."""
    reason: str = ""
    summary: RunSummary | None = None
    api_server_count: int = 1

    @property
    def label(self) -> str:
        servers = f", api-server-count {self.api_server_count}" if self.api_server_count != 1 else ""
        return f"{self.replicas}× {self.gpu} TP{self.tp}, max-num-seqs {self.max_num_seqs}{servers}"

    @property
    def cost_per_million_output_tokens(self) -> float | None:
        if self.cost_per_hour is None or self.summary is None:
            return None
        rate = self.summary.throughput.output_tokens_per_s
        return self.cost_per_hour / (rate * 3600 / 1e6) if rate > 0 else None


@dataclass
class SearchOutcome:
    candidates: list[Candidate]
    best: Candidate | None
    evaluated: int
    simulated: int
    ranked_by: str


def parse_prices(text: str | None) -> dict[str, float]:
    """'h100=3.0,l40s=1.1' → {'h100': 3.0, 'l40s': 1.1} (GPU names checked)."""
    prices: dict[str, float] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise UserError(f"--price: '{part}' has no '='; write it like h100=3.0,l40s=1.1 (dollars per GPU-hour)")
        name, value = (item.strip() for item in part.split("=", 1))
        try:
            price = float(value)
        except ValueError:
            raise UserError(f"--price: '{value}' for {name} is not a number") from None
        if price < 0:
            raise UserError(f"--price: the price for {name} must not be negative")
        prices[get_gpu(name).key] = price
    return prices


def slo_misses(summary: RunSummary, slo: SLO) -> list[str]:
    """Each SLO bound the run's percentiles break, as 'ttft_p95 812 ms > 500 ms'."""
    misses = []
    for key, bound_s in slo.bounds_s.items():
        metric, statistic = key.split("_", 1)  # an SLO key names a metric and a statistic: ttft_p95
        value_ms = summary.latency(f"{metric}_ms").stat(statistic)
        if value_ms is None or value_ms / 1000.0 > bound_s:
            shown = "no data" if value_ms is None else f"{value_ms:.0f} ms"
            misses.append(f"{key} {shown} > {bound_s * 1000:.0f} ms")
    return misses


def queue_growth(records: list[RequestRecord]) -> tuple[float, float] | None:
    """Mean TTFT (s) of the first and the last tenth of requests by send time, or None if too few."""
    ordered = sorted((r for r in records if r.ttft_s is not None), key=lambda record: record.sent_at_s)
    tenth = len(ordered) // 10
    if tenth < 2:
        return None
    first = sum(record.ttft_s or 0.0 for record in ordered[:tenth]) / tenth
    last = sum(record.ttft_s or 0.0 for record in ordered[-tenth:]) / tenth
    return first, last


def _judge(candidate: Candidate, result: RunResult, slo: SLO, load: LoadSpec) -> None:
    summary = result.summary
    candidate.summary = summary
    reasons = slo_misses(summary, slo)
    failed = summary.requests.failed
    if failed:
        reasons.append(f"{failed} requests did not finish")
    growth = queue_growth(result.records) if load.rate is not None else None
    if growth is not None:
        first, last = growth
        if last > QUEUE_GROWTH_FACTOR * first and last - first > QUEUE_GROWTH_MIN_S:
            reasons.append(f"overloaded at {load.rate:g} req/s: the queue grows (TTFT {first:.2f} s early, {last:.2f} s late)")
    frontend = summary.simulation.frontend if summary.simulation is not None else None
    if reasons and frontend is not None and frontend_is_limit(frontend):
        reasons.append(f"frontend-bound (API servers {frontend.utilization:.0%} busy): try more --api-server-counts")
    candidate.status = "misses" if reasons else "meets"
    candidate.reason = "; ".join(reasons)


def enumerate_candidates(space: SearchSpace, prices: dict[str, float]) -> list[Candidate]:
    gpus = [get_gpu(name) for name in space.gpus]
    if prices:
        missing = [gpu.key for gpu in gpus if gpu.key not in prices]
        if missing:
            raise UserError(f"--price has no price for {', '.join(missing)}; give one for every GPU in --gpus")
    candidates = []
    for gpu in gpus:
        for tp in space.tps:
            for max_num_seqs in space.max_num_seqs:
                for servers in sorted(space.api_server_counts):
                    for replicas in sorted(space.replicas):
                        num_gpus = tp * replicas
                        price = prices.get(gpu.key)
                        candidates.append(
                            Candidate(
                                gpu.key,
                                tp,
                                replicas,
                                max_num_seqs,
                                num_gpus,
                                None if price is None else price * num_gpus,
                                api_server_count=servers,
                            )
                        )
    return candidates


def run_search(
    space: SearchSpace,
    load: LoadSpec,
    slo: SLO,
    *,
    prices: dict[str, float],
    calibration: Calibration,
    prune: bool = True,
    progress: Callable[[Candidate], None] | None = None,
) -> SearchOutcome:
    """Judge every candidate and pick the cheapest that meets the SLO."""
    if not slo.bounds_s:
        raise UserError("--slo is required for a search, e.g. --slo ttft_p95=500ms,tpot_p95=50ms")
    model = load_model(space.model)
    candidates = enumerate_candidates(space, prices)
    simulated = 0
    passed_shapes: set[tuple[str, int, int, int]] = set()
    for candidate in candidates:
        shape = (candidate.gpu, candidate.tp, candidate.max_num_seqs, candidate.api_server_count)
        if candidate.num_gpus > space.max_gpus:
            candidate.status, candidate.reason = "over budget", f"needs {candidate.num_gpus} GPUs > --max-gpus {space.max_gpus}"
        elif prune and shape in passed_shapes:
            candidate.status, candidate.reason = "pruned", "fewer replicas of this shape already meet the SLO"
        else:
            try:
                setup = PlanSetup(
                    model=model,
                    gpu=get_gpu(candidate.gpu),
                    tp=candidate.tp,
                    replicas=candidate.replicas,
                    weight_dtype=space.weight_dtype,
                    kv_dtype=space.kv_dtype,
                    calibration=calibration,
                    max_num_seqs=candidate.max_num_seqs,
                    max_num_batched_tokens=space.max_num_batched_tokens,
                    frontend=replace(space.frontend, api_server_count=candidate.api_server_count),
                )
                setup.memory()
                output = simulate_run(setup, load, slo=slo, record_token_times=True)
                simulated += 1
                _judge(candidate, output.result, slo, load)
                if candidate.status == "meets":
                    passed_shapes.add(shape)
            except UserError as err:
                candidate.status, candidate.reason = "does not fit", err.message
        if progress:
            progress(candidate)
    ranked_by = "cost per hour" if prices else "GPU count (no --price given)"
    meeting = [candidate for candidate in candidates if candidate.status == "meets"]
    meeting.sort(key=_rank_key)
    best = meeting[0] if meeting else None
    if best is not None:
        for candidate in meeting[1:]:
            candidate.reason = _why_costlier(candidate, best)
    return SearchOutcome(candidates, best, len(candidates), simulated, ranked_by)


def _rank_key(candidate: Candidate) -> tuple[float, int, int, float]:
    cost = candidate.cost_per_hour if candidate.cost_per_hour is not None else float(candidate.num_gpus)
    ttft = (candidate.summary.ttft_ms.p95 if candidate.summary is not None else None) or 0.0
    return (cost, candidate.num_gpus, candidate.api_server_count, ttft)


def _why_costlier(candidate: Candidate, best: Candidate) -> str:
    if candidate.cost_per_hour is not None and best.cost_per_hour is not None:
        extra = candidate.cost_per_hour - best.cost_per_hour
        if extra > 1e-9:
            return f"meets the SLO but costs ${extra:.2f}/h more"
    if candidate.num_gpus > best.num_gpus:
        return f"meets the SLO but needs {candidate.num_gpus - best.num_gpus} more GPU(s)"
    if candidate.api_server_count > best.api_server_count:
        return f"meets the SLO but needs {candidate.api_server_count - best.api_server_count} more API server process(es)"
    return "meets the SLO at the same cost; ranked lower on p95 TTFT"


def runners_up(outcome: SearchOutcome, limit: int = 8) -> list[Candidate]:
    """The most instructive losers: cheaper ones that missed, then costlier ones that met."""
    best = outcome.best
    order = {"meets": 0, "misses": 1, "does not fit": 2, "over budget": 3, "pruned": 4}
    others = [candidate for candidate in outcome.candidates if candidate is not best and candidate.status != "pruned"]
    others.sort(key=lambda candidate: (order.get(candidate.status, 9), _rank_key(candidate)))
    if best is not None:
        cheaper_missing = [c for c in others if c.status == "misses" and _rank_key(c) < _rank_key(best)]
        rest = [c for c in others if c not in cheaper_missing]
        others = cheaper_missing + rest
    return others[:limit]
