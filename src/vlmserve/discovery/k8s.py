"""`k8s:NAMESPACE/SERVICE[:PORTNAME]`: a Service's ready endpoints, from its EndpointSlices.

Read through the official `kubernetes` client with a periodic list (label
`kubernetes.io/service-name=SERVICE`), not a watch: a list every few seconds is one small request,
needs no resume logic after the API server closes a watch, and a failed list simply keeps the
previous set. The gateway needs `list` on `endpointslices` in the namespace (the Role that
`vlmserve export k8s` writes). Credentials: the pod's service account when it runs in a cluster
(KUBERNETES_SERVICE_HOST is set), else the kubeconfig ($KUBECONFIG or ~/.kube/config).

An endpoint counts when its `ready` condition is not false (absent means ready, as the API says);
the port is PORTNAME, else the slice's only port, else the port named `http`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from vlmserve.discovery.sources import DiscoveryError, url_for
from vlmserve.errors import UserError

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
LIST_TIMEOUT_S = 10.0


def _client_configuration() -> Any:
    """The API client's configuration: in-cluster when running in a pod, else the kubeconfig."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(client_configuration=configuration, persist_config=False)
    except (ConfigException, OSError, TypeError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"--discover k8s: no Kubernetes credentials ({first_line}); run in a pod with a service account, or set KUBECONFIG"
        ) from None
    return configuration


class _Port(Protocol):
    """An EndpointSlice port (kubernetes' V1EndpointPort), as read here."""

    name: str | None
    port: int | None


class _Conditions(Protocol):
    ready: bool | None


class _Endpoint(Protocol):
    addresses: list[str] | None
    conditions: _Conditions | None


class EndpointSliceLike(Protocol):
    """The parts of kubernetes' V1EndpointSlice that discovery reads (tests pass plain objects)."""

    ports: list[_Port] | None
    endpoints: list[_Endpoint] | None


def _pick_port(ports: Sequence[_Port], port_name: str | None) -> int | None:
    if port_name is not None:
        return next((p.port for p in ports if p.name == port_name and p.port), None)
    if len(ports) == 1:
        return ports[0].port
    return next((p.port for p in ports if p.name == "http" and p.port), None)


def urls_from_slices(slices: Sequence[EndpointSliceLike], port_name: str | None) -> list[str]:
    """Base URLs of the ready endpoints of `slices` (V1EndpointSlice objects)."""
    urls: set[str] = set()
    for endpoint_slice in slices:
        port = _pick_port(endpoint_slice.ports or [], port_name)
        if port is None:
            continue
        for endpoint in endpoint_slice.endpoints or []:
            conditions = endpoint.conditions
            if conditions is not None and conditions.ready is False:
                continue
            for address in endpoint.addresses or []:
                urls.add(url_for(address, port))
    return sorted(urls)


@dataclass
class EndpointSliceSource:
    """Lists the Service's EndpointSlices each time it is read."""

    namespace: str
    service: str
    port_name: str | None = None
    description: str = ""
    _api: Any = field(default=None, repr=False)
    _api_client: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        port = f":{self.port_name}" if self.port_name else ""
        self.description = self.description or f"k8s:{self.namespace}/{self.service}{port}"

    def prepare(self) -> None:
        """Load credentials now, so a missing kubeconfig is a one-line error at start, not a warning later."""
        if self._api is None:
            from kubernetes import client

            self._api_client = client.ApiClient(_client_configuration())
            self._api = client.DiscoveryV1Api(self._api_client)

    def _list(self) -> list[EndpointSliceLike]:
        from kubernetes.client.exceptions import ApiException

        try:
            answer = self._api.list_namespaced_endpoint_slice(
                self.namespace, label_selector=f"{SERVICE_NAME_LABEL}={self.service}", _request_timeout=LIST_TIMEOUT_S
            )
        except ApiException as err:
            raise DiscoveryError(
                "api_error", f"listing EndpointSlices of {self.namespace}/{self.service} failed: HTTP {err.status} {err.reason}"
            ) from None
        except Exception as err:  # urllib3 connection errors, a malformed answer
            raise DiscoveryError(
                "api_error", f"listing EndpointSlices of {self.namespace}/{self.service} failed: {type(err).__name__}"
            ) from None
        return list(answer.items or [])

    async def read(self) -> list[str] | None:
        self.prepare()
        slices = await asyncio.to_thread(self._list)
        if not slices:
            raise DiscoveryError(
                "unresolved", f"Service {self.namespace}/{self.service} has no EndpointSlices (does it exist, with a selector?)"
            )
        return urls_from_slices(slices, self.port_name)

    def close(self) -> None:
        if self._api_client is not None:
            self._api_client.close()
            self._api_client = self._api = None
