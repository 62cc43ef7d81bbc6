"""HTTP/1.1 for the whole project, on one kept parser: llhttp (through httptools).

Why llhttp: it is the parser Node.js, uvicorn and aiohttp use, written from a specification,
strict by default (CL+TE, duplicate Content-Length, obs-fold, bare LF, NUL, non-hex chunk sizes
and overflowing ones are errors) and fuzzed upstream. Everything here speaks the same framing
rules because everything parses with it:

- `headers`  — the header map both sides use, and the bytes of a response head and a chunk.
- `reader`   — a response parser, fed by the client.
- `client`   — the one HTTP client of the hot paths: pooled keep-alive connections whose answers
               go, chunk by chunk, to a listener (the gateway's relay, the bench's SSE reader).
- `server`   — the gateway's server protocol: requests in, answers (whole or streamed) out.

What this layer refuses beyond llhttp's own errors (one place, `headers.Headers.add` and
`headers.check_framing`): a header that must appear once (Host, Content-Length, Content-Type,
Authorization, Transfer-Encoding ...) sent twice, and a Transfer-Encoding other than exactly
`chunked`.
"""
