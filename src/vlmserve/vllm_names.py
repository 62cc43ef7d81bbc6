"""Names vLLM itself defines that more than one layer of vlmserve reads.

Kept at the bottom of the layering so that the autoscaling rule (spec layer), the dashboards
(observe), the gateway's load reader and `up`'s autoscaler all name the engine's queue with the
same string, written once here.
"""

from __future__ import annotations

NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
"""Requests an engine has accepted but not scheduled yet (vLLM V1's scheduler queue, a gauge):
what KEDA's production rule for vLLM scales on, and what `up --autoscale` polls."""
