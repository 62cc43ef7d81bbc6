"""`vlmserve bench`: load-test any OpenAI-compatible endpoint and trust the figures.

The package follows one split: a workload decides *what* each request says
(`workloads/`), a strategy in `load.py` decides *when* it is sent, a constraint
decides when to stop, `client.py` turns one streamed request into a
`RequestRecord`, and `metrics.py` is the only place figures are computed.
"""
