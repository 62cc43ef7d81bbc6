"""Where the replicas are, for anything that routes to them: a file, DNS, or Kubernetes
EndpointSlices (`sources.py`, `k8s.py`), polled into a list of URLs.

The gateway admits the URLs it is given and drains the ones that leave; `up` and `export k8s`
check a source's spelling with the same parser. Nothing here speaks HTTP to a replica.
"""
