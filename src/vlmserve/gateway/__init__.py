"""`vlmserve gateway`: an OpenAI-compatible router across engine replicas.

The pieces, each in its own module:
- `config`     — every knob in one dataclass (the CLI and `vlmserve up` fill it).
- `request_info` — what the router needs to know about a request (model, size, prefix).
- `routing`    — choose a replica (filters, weighted scorers, a picker); hear about a request's life.
- `replicas`   — health checks, circuit breakers, engine-metric polling.
- `admission`  — API keys → tenants, token buckets, the priority queue.
- `proxy`      — forwarding with retries, timeouts and stream pass-through.
- `app` / `server` — the handlers per route kind and ways to run them (on http1/server.py).
"""

from vlmserve.gateway.config import GatewayConfig

__all__ = ["GatewayConfig"]
