"""Observability pack: Grafana dashboards, Prometheus alert rules and scrape configs.

Everything is generated from one table of PromQL queries (`queries.py`) so that the
dashboards, the alerts and the tests that check them against a real Prometheus can
never disagree about a metric name.
"""
