"""What a run's prompts should get from the engine's prefix cache, and whether they got more.

A bench figure is only as honest as its prompts: a cached prompt skips prefill, so a run
whose prompts repeat reports a TTFT its users will not see (512-token prompts cycled at 4
users gave a 0.73 hit rate and a fifth of the TTFT). The workload states its reuse
(fresh prompts, a shared prefix, a prompt pool); this module turns that into an expected
hit rate and compares it with the one the engine measured (/metrics, `bench.scrape`).
A mismatch becomes a warning in every output.
"""

from __future__ import annotations

from vlmserve.results.blocks import PrefixCacheBlock, ServerBlock
from vlmserve.spec import LoadSpec

HIT_RATE_TOLERANCE = 0.1
"""How far the measured hit rate may stray from the intended one before the run is flagged."""


def intended_reuse(load: LoadSpec) -> str:
    """The workload's reuse in words, as the warnings and the console name it."""
    parts = [f"a pool of {load.prompt_pool_size} prompts" if load.prompt_pool_size else "fresh prompts"]
    if load.shared_prefix_len:
        parts.append(f"a {load.shared_prefix_len}-token shared prefix")
    return " with ".join(parts)


def expected_hit_rate(load: LoadSpec, requests_sent: int) -> float | None:
    """The share of prompt tokens the prefix cache should serve; None where it cannot be estimated.

    Fresh prompts: 0. A shared prefix: prefix/prompt for every request but the first. A pool of
    D distinct prompts among R requests: the R − D repeats are served whole. Multi-turn history
    and images (cached by content) make the figure workload-specific, so they get None.
    """
    if load.dataset not in ("random", "sharegpt", "trace") or load.multi_turn != "first" or requests_sent <= 0:
        return None
    shared = load.shared_prefix_len / load.input_len if load.dataset == "random" else 0.0
    distinct = min(load.prompt_pool_size or requests_sent, requests_sent)
    first_uses = shared * max(distinct - 1, 0)
    return (first_uses + (requests_sent - distinct)) / requests_sent


def prefix_cache_block(load: LoadSpec, server: ServerBlock, requests_sent: int) -> PrefixCacheBlock:
    """The summary's `prefix_cache` block: measured and expected hit rates and whether they disagree."""
    measured = server.prefix_cache_hit_rate if server.available else None
    expected = expected_hit_rate(load, requests_sent)
    verdict = "unknown"
    if measured is not None and expected is not None:
        if measured > expected + HIT_RATE_TOLERANCE:
            verdict = "above"
        elif measured < expected - HIT_RATE_TOLERANCE:
            verdict = "below"
        else:
            verdict = "as intended"
    return PrefixCacheBlock(
        workload=intended_reuse(load), measured_hit_rate=measured, expected_hit_rate=expected, verdict=verdict
    )


def prefix_cache_warnings(block: PrefixCacheBlock) -> list[str]:
    """One line per mismatch, saying what it does to the figures and what to do."""
    measured, expected = block.measured_hit_rate, block.expected_hit_rate
    if measured is None or expected is None:
        return []  # a verdict needs both rates
    if block.verdict == "above":
        return [
            f"prefix-cache hit rate {measured:.0%} is above the {expected:.0%} this workload intends "
            f"({block.workload}): the engine served repeated prompts from its cache, so TTFT is flattered; "
            "make reuse explicit with --prompt-pool-size or --shared-prefix-len, or check the dataset for repeats"
        ]
    if block.verdict == "below":
        return [
            f"prefix-cache hit rate {measured:.0%} is below the {expected:.0%} this workload intends "
            f"({block.workload}): prefix caching is off or its cache too small, so TTFT includes prefill "
            "the workload meant to reuse"
        ]
    return []
