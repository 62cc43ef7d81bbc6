"""The server's own view of a run, from its Prometheus /metrics (vLLM names).

Counters are read before and after the run and reported as deltas; gauges (running
and waiting requests, KV-cache usage) are sampled every second to find their peaks.
Anything the target does not export is simply absent; a target without /metrics
(not every OpenAI-compatible server has one) gives `available: false`.

Behind a vlmserve gateway (its /metrics has `vlmserve_gateway_replicas` and no engine series) the
engines' figures come from the gateway's merged page of its replicas' own /metrics
(`/admin/engine-metrics`, read with the bench's key: it needs an admin key when the gateway has a
keys file). Counters are then summed over the replicas, and KV-cache usage is the fullest
replica's (a utilisation is never summed). Why they stay unknown, when they do, is said once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from vlmserve import prometheus_text
from vlmserve import vllm_names as vllm
from vlmserve.async_tasks import cancel_and_wait
from vlmserve.bench.engine_breakdown import SAMPLE_NAMES, engine_breakdown
from vlmserve.results.blocks import ServerBlock
from vlmserve.vllm_names import total

COUNTERS = {
    "prefix_cache_queries": (total(vllm.PREFIX_CACHE_QUERIES), total(vllm.PREFIX_CACHE_QUERIES_LEGACY)),
    "prefix_cache_hits": (total(vllm.PREFIX_CACHE_HITS), total(vllm.PREFIX_CACHE_HITS_LEGACY)),
    "preemptions": (total(vllm.NUM_PREEMPTIONS),),
    "prompt_tokens": (total(vllm.PROMPT_TOKENS),),
    "generation_tokens": (total(vllm.GENERATION_TOKENS),),
    "requests_finished": (total(vllm.REQUEST_SUCCESS),),
    "mm_cache_queries": (total(vllm.MM_CACHE_QUERIES),),
    "mm_cache_hits": (total(vllm.MM_CACHE_HITS),),
}
"""Counter deltas reported under `server`, by the first of their names the target exports."""

GAUGES = {
    "running": (vllm.NUM_REQUESTS_RUNNING,),
    "waiting": (vllm.NUM_REQUESTS_WAITING,),
    "kv_cache_usage": (vllm.KV_CACHE_USAGE, vllm.KV_CACHE_USAGE_LEGACY),
}
"""Gauges sampled every second; their peaks are reported."""


ROUTABLE_REPLICAS = "vlmserve_gateway_replicas"
"""A gateway's replicas in rotation (its `state="routable"` series): sampled with the gauges, so a
run against `up --autoscale` records its replica count over time (`replicas_timeline`)."""
_ROUTABLE_LINE = ROUTABLE_REPLICAS + '{state="routable"}'

WANTED_NAMES = (*(name for names in (*COUNTERS.values(), *GAUGES.values()) for name in names), *SAMPLE_NAMES)
_WANTED_PREFIXES = (*(name + end for name in WANTED_NAMES for end in ("{", " ")), _ROUTABLE_LINE)

UTILISATIONS = frozenset(GAUGES["kv_cache_usage"])
"""Gauges of a fraction (0..1): over label sets (engines, replicas) the highest is kept, never a sum."""

MAX_SCRAPE_BYTES = 16 * prometheus_text.MAX_PAGE_BYTES
"""A page the bench reads: a gateway's merged page of 16 replicas at the gateway's own bound for each."""

ADMIN_KEY_NEEDED = "engine metrics behind the gateway need an admin key"
"""Why the engines' figures are unknown when the gateway refuses the bench's key (403)."""


def parse_samples(text: str, wanted: tuple[str, ...] | None = _WANTED_PREFIXES) -> dict[str, float]:
    """Sample name → value summed over label sets (several engines, or a gateway's replicas, add
    up), but the highest for a utilisation (UTILISATIONS): two engines 60% full are not 120% full.

    Only the lines of the metrics we report are parsed (`wanted`: line prefixes; None parses
    everything). A vLLM /metrics page has thousands of histogram lines; parsing all of them
    in Python takes milliseconds, and during a run that time would be taken from the event
    loop that timestamps the answers.
    """
    if wanted is not None:
        text = "\n".join(line for line in text.splitlines() if line.startswith(wanted))
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, value = sample.name, float(sample.value)
            if name.endswith("_created"):
                continue
            if name in UTILISATIONS:
                values[name] = max(values.get(name, value), value)
            else:
                values[name] = values.get(name, 0.0) + value
    return values


def _first(values: dict[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in values:
            return values[name]
    return None


async def fetch_metrics(session: aiohttp.ClientSession, url: str) -> tuple[dict[str, float] | None, int | None]:
    """One scrape: its samples (None when the page is missing or unusable) and the HTTP status
    (None when nothing answered). A page over MAX_SCRAPE_BYTES is unusable, and not read on."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
            if response.status != 200 or (response.content_length or 0) > MAX_SCRAPE_BYTES:
                return None, response.status
            page = bytearray()
            async for chunk in response.content.iter_chunked(1 << 16):
                page += chunk
                if len(page) > MAX_SCRAPE_BYTES:
                    return None, response.status
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None, None
    try:
        return parse_samples(page.decode("utf-8", "replace")), 200
    except (ValueError, TypeError):
        return None, 200


def is_gateway(values: dict[str, float]) -> bool:
    """A vlmserve gateway's own page: its replica count, and no engine's series."""
    return ROUTABLE_REPLICAS in values and not any(name.startswith(vllm.PREFIX) for name in values)


@dataclass
class ServerScraper:
    """Scrapes /metrics before, every second during, and after a run."""

    base_url: str
    headers: dict[str, str] = field(default_factory=dict)
    interval_s: float = 1.0
    before: dict[str, float] | None = None
    after: dict[str, float] | None = None
    peaks: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    replicas_timeline: list[tuple[float, float]] = field(default_factory=list)
    """(wall-clock time, replicas in the gateway's rotation) per scrape, when the target is a gateway."""
    engines_url: str | None = None
    """The gateway's merged page of its engines' /metrics, once the target is seen to be a gateway."""
    engines_unknown: str | None = None
    """Why the engines' figures behind a gateway are unknown (then that page is not asked again)."""
    _task: asyncio.Task | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"{self.base_url}/metrics"

    async def _scrape(self) -> dict[str, float] | None:
        """The target's samples and, behind a gateway, its engines' (the first scrape finds out which)."""
        assert self._session is not None
        values, _ = await fetch_metrics(self._session, self.url)
        if values is None or self.engines_unknown is not None:
            return values
        if self.engines_url is None:
            if self.before is not None or not is_gateway(values):
                return values
            self.engines_url = self.base_url + prometheus_text.GATEWAY_PATH
        engines, status = await fetch_metrics(self._session, self.engines_url)
        if engines is not None:
            return {**values, **engines}
        if self.before is None:  # the first scrape: say why once and stop asking
            self.engines_unknown = (
                ADMIN_KEY_NEEDED if status == 403 else f"{self.engines_url} answered {f'HTTP {status}' if status else 'nothing'}"
            )
        return values

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(headers=self.headers)
        self.before = await self._scrape()
        if self.before is not None:
            self._observe(self.before)
            if self.interval_s > 0:
                self._task = asyncio.create_task(self._sample_forever())

    def _observe(self, values: dict[str, float]) -> None:
        self.samples += 1
        if ROUTABLE_REPLICAS in values:
            self.replicas_timeline.append((time.time(), values[ROUTABLE_REPLICAS]))
        for key, names in GAUGES.items():
            value = _first(values, names)
            if value is not None:
                self.peaks[key] = max(self.peaks.get(key, value), value)

    async def _sample_forever(self) -> None:
        assert self._session is not None
        while True:
            await asyncio.sleep(self.interval_s)
            values = await self._scrape()
            if values is not None:
                self._observe(values)

    async def stop(self) -> ServerBlock:
        """Stop sampling, scrape once more and return the `server` block of the summary."""
        await cancel_and_wait(self._task)
        if self._session is not None:
            if self.before is not None:
                self.after = await self._scrape()
            await self._session.close()
        return self.summary()

    @property
    def read(self) -> str:
        """What the figures were read from: the target's /metrics and, behind a gateway, its engines' page."""
        return self.url if self.engines_url is None or self.engines_unknown else f"{self.url} + {self.engines_url}"

    def summary(self) -> ServerBlock:
        if self.before is None or self.after is None:
            return ServerBlock(available=False, metrics_url=self.url)
        read = self.read
        if (
            self.engines_url is not None
            and self.engines_unknown is None
            and not any(name.startswith(vllm.PREFIX) for name in self.after)
        ):
            self.engines_unknown = f"{self.engines_url} did not answer after the load"
        self._observe(self.after)
        deltas: dict[str, float | None] = {}
        for key, names in COUNTERS.items():
            start, end = _first(self.before, names), _first(self.after, names)
            deltas[key] = (end - start) if start is not None and end is not None else None
        queries, hits = deltas.get("prefix_cache_queries"), deltas.get("prefix_cache_hits")
        mm_queries, mm_hits = deltas.get("mm_cache_queries"), deltas.get("mm_cache_hits")
        return ServerBlock(
            available=True,
            metrics_url=read,
            engines_unknown=self.engines_unknown,
            counters=deltas,
            prefix_cache_hit_rate=(hits / queries) if queries and hits is not None else None,
            mm_cache_hit_rate=(mm_hits / mm_queries) if mm_queries and mm_hits is not None else None,
            engine_breakdown=engine_breakdown(self.before, self.after),
            preemptions=deltas.get("preemptions"),
            peak_running=self.peaks.get("running"),
            peak_waiting=self.peaks.get("waiting"),
            peak_kv_cache_usage=self.peaks.get("kv_cache_usage"),
            gauge_samples=self.samples,
            replicas_timeline=[(round(at, 3), count) for at, count in self.replicas_timeline] or None,
        )
