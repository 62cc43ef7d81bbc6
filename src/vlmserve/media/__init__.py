"""What a request may carry, checked before any engine sees it: the media policy.

- `urls`      — which media parts a request holds, and the allowed remote hosts.
- `addresses` — a remote host that resolves to an internal address is refused (SSRF).
- `preflight` — images within the byte, pixel and count limits, probed without decoding,
                downscaled where the operator asks, with their token estimate.
- `workers`   — the processes that decode and resize images, off the gateway's event loop.

The gateway (gateway/app.py) runs it per request; nothing here knows about HTTP.
"""
