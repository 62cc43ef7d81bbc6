"""How `up --autoscale` tells its gateway which replicas to route to: a members file.

The gateway already admits replicas that come and go from a `file:` source (vlmserve.discovery):
a new URL is routed to once its health check passes, a removed one drains. So the supervisor
lists the replicas that serve in `<state dir>/members.txt` and the gateway runs with
`--discover file:...`; a replica is written there only after it is started, verified and warmed,
and taken out before it is stopped. The file is replaced whole by a rename, so the gateway never
reads half of it.
"""

from __future__ import annotations

import os
from pathlib import Path

from vlmserve.errors import UserError
from vlmserve.spec import DeploymentSpec

MEMBERS_FILE = "members.txt"
DISCOVER_INTERVAL_S = 0.25
"""How often the gateway rereads the members file under autoscale: a change is applied once two
reads agree, so a replica joins or leaves the rotation within about half a second."""


def check_autoscale(spec: DeploymentSpec) -> None:
    """Refuse autoscale settings `up` cannot carry out, before anything starts."""
    if spec.autoscale is None:
        return
    if not spec.gateway:
        raise UserError(
            "autoscale needs the gateway (it routes to the replicas that come and go); drop --no-gateway or the autoscale setting"
        )
    if spec.gateway_discover:
        raise UserError(
            "autoscale and gateway_discover both set the gateway's replicas; give one (autoscale writes its own members file)"
        )
    ports = spec.model_copy(update={"replicas": spec.autoscale.max_replicas}).replica_ports()
    if ports[-1] > 65535:
        raise UserError(
            f"autoscale max_replicas {spec.autoscale.max_replicas} needs ports up to {ports[-1]}; "
            "lower the port or replica_base_port"
        )


def write_members_file(path: Path, urls: list[str]) -> None:
    """Replace the file with `urls`, one a line, atomically (written beside it, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text("# replicas in rotation, written by vlmserve up --autoscale\n" + "".join(f"{url}\n" for url in urls))
    os.replace(partial, path)
