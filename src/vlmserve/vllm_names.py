"""vLLM's metric names, written once: what vlmserve reads from engines, serves from the sim engine
and queries in dashboards and alerts.

Names are the family names vLLM registers (`vllm:` and the metric); a counter's samples carry a
`_total` suffix on the wire (`total(NAME)`), which is also the name PromQL selects. Where vLLM
renamed a metric, the old name it served before is kept beside the new (`*_LEGACY`), because a
user's older engine still exposes it. Test: no other module writes a `vllm:` literal
(tests/unit/test_vllm_names.py).
"""

from __future__ import annotations

PREFIX = "vllm:"

# Gauges: the engine's state now.
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
KV_CACHE_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # labels: block size, KV dtype, prefix caching, ...
LORA_REQUESTS_INFO = "vllm:lora_requests_info"  # labels: the adapters with requests running or waiting

# Counters (samples `total(NAME)`).
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
PREFIX_CACHE_QUERIES_LEGACY = "vllm:gpu_prefix_cache_queries"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
PREFIX_CACHE_HITS_LEGACY = "vllm:gpu_prefix_cache_hits"
MM_CACHE_QUERIES = "vllm:mm_cache_queries"
MM_CACHE_HITS = "vllm:mm_cache_hits"
NUM_PREEMPTIONS = "vllm:num_preemptions"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"

# Histograms (samples `_bucket`, `_sum`, `_count`).
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"  # `vllm:time_per_output_token_seconds` before
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME = "vllm:request_queue_time_seconds"
REQUEST_PREFILL_TIME = "vllm:request_prefill_time_seconds"
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"


def total(counter: str) -> str:
    """A counter's sample name as it is on the wire and in PromQL."""
    return counter + "_total"


def underscored(name: str) -> str:
    """The name with `:` as `_`, as some exporters and parsers spell it."""
    return name.replace(":", "_")
