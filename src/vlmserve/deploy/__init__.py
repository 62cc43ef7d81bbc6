"""Deployment: start, check, supervise and stop engine replicas and the gateway in front.

`supervisor` runs a deployment, `readiness` proves each member serves, `liveness` restarts hung
ones, `processes` owns process groups and ports, `state` is the typed record `status`/`down` read.
"""
