"""A minimal stand-in for the Kubernetes API server: the EndpointSlice list, nothing else.

No API server can run in this test environment (no kind, no etcd, no container runtime), so the
`k8s:` discovery source is tested against this: a real HTTP server answering
GET /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices?labelSelector=kubernetes.io/service-name=SVC
with an EndpointSliceList in the API's own JSON shape, which the official `kubernetes` client
(configured from a real kubeconfig file) requests and deserialises exactly as it would from a
cluster. It records what it was asked (paths, Authorization headers) so a test can check the
client's side, and a test can change the slices, or make it fail, while the gateway runs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import yaml

TOKEN = "test-token-for-the-fake-api"


def endpoint_slice(
    service: str,
    namespace: str,
    addresses: list[tuple[str, bool]],
    port: int,
    port_name: str = "http",
    name_suffix: str = "abcde",
) -> dict:
    """One EndpointSlice of `service`: (address, ready) pairs on one named port."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "addressType": "IPv4",
        "metadata": {
            "name": f"{service}-{name_suffix}",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service},
        },
        "endpoints": [
            {"addresses": [address], "conditions": {"ready": ready, "serving": ready, "terminating": False}}
            for address, ready in addresses
        ],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


@dataclass
class FakeApi:
    """The served state: slices per (namespace, service), or an HTTP status to fail with."""

    slices: dict[tuple[str, str], list[dict]] = field(default_factory=dict)
    fail_with: int | None = None
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path?query, Authorization)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
                }
            )
        )
        return path


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _answer(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            api.requests.append((self.path, self.headers.get("Authorization")))
            parts = urlsplit(self.path)
            segments = parts.path.strip("/").split("/")
            if api.fail_with is not None:
                self._answer(
                    api.fail_with,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "message": "injected failure",
                        "code": api.fail_with,
                    },
                )
                return
            if segments[:3] != ["apis", "discovery.k8s.io", "v1"] or len(segments) != 6 or segments[5] != "endpointslices":
                self._answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})
                return
            namespace = segments[4]
            selector = parse_qs(parts.query).get("labelSelector", [""])[0]
            service = selector.removeprefix("kubernetes.io/service-name=")
            items = api.slices.get((namespace, service), [])
            self._answer(
                200,
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSliceList",
                    "metadata": {"resourceVersion": "1"},
                    "items": items,
                },
            )

    return Handler


@contextmanager
def fake_k8s_api() -> Iterator[FakeApi]:
    """Serve a FakeApi on a free loopback port in a background thread until the block ends."""
    api = FakeApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    api.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
