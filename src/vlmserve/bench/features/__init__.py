"""Feature workloads: tools, structured output and thinking, layered on any dataset, and their checks.

`catalogue` holds the schemas sent, `request` how one request carries its features,
`assign` decides them per request, `check` judges each answer after the run. The figures
(valid rates, reasoning timings) are computed in `vlmserve.results.features`.
"""
