"""One real embedded vLLM engine for the whole test session (it takes about a minute to start).

Use the `embedded_engine` fixture (tests/conftest.py) rather than starting your own: every
engine costs a minute of the shared CPU and about 3.5 GB of memory. The engine runs under
the real supervisor, so it has passed the same readiness checks `vlmserve up` uses.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from vlmserve.demo.run import demo_spec
from vlmserve.deploy.supervisor import Supervisor
from vlmserve.spec import DeploymentSpec

EMBEDDED_MAX_MODEL_LEN = 2048


class _DropSpans(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class TraceSink:
    """Accepts and drops the shared engine's OTLP/HTTP span exports, so that its exporter never fails
    and backs off (its retries would delay the spans a test waits for); `released()` frees the port
    while a test's bench listens there with its own receiver."""

    def __init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _DropSpans)
        self.port = int(self._server.server_address[1])
        self._serve()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def _serve(self) -> None:
        threading.Thread(target=self._server.serve_forever, name="trace-sink", daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @contextmanager
    def released(self) -> Iterator[int]:
        """The port, free for the body of the `with` (a bench's receiver binds it); taken back after."""
        self.close()
        try:
            yield self.port
        finally:
            self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _DropSpans)
            self._serve()


@dataclass(frozen=True)
class EmbeddedEngine:
    """Where the shared engine listens and what it serves."""

    base_url: str
    model: str
    model_path: str
    max_model_len: int
    log_path: Path
    pid: int
    spec: DeploymentSpec
    trace_sink: TraceSink | None = None
    """Where the engine exports its trace spans (the session engine's; None: it exports none)."""


@contextmanager
def start_embedded_engine(
    workdir: Path,
    *,
    max_model_len: int = EMBEDDED_MAX_MODEL_LEN,
    extra_args: tuple[str, ...] = (),
    tool_parser: str | None = None,
    trace_sink: TraceSink | None = None,
) -> Iterator[EmbeddedEngine]:
    """Start the embedded model on free ports; stop it (whole process tree) on exit.

    With `trace_sink`, the engine exports its trace spans there (`--otlp-traces-endpoint`): a test
    reads them by releasing the sink's port to its bench (tests/e2e/bench/test_engine_breakdown.py)."""
    # The tests put a gateway in front of this engine (as `vlmserve up` does), and the gateway adds
    # per-request processor kwargs when it downscales images: the engine must accept them.
    # The embedded model's recipe loads a tool parser (the feature-workload tests send tools), so
    # these tests exercise the flags `vlmserve up` gives it; `tool_parser` replaces the recipe's.
    # The parser is not free: vLLM builds one per chat request, tools or not (a few ms of frontend
    # time on this machine), which the TTFT breakdown test's bound on the time outside the engine's
    # clock leaves room for.
    tool_flags = ("--enable-auto-tool-choice", "--tool-call-parser", tool_parser) if tool_parser else ()
    trace_flags = ("--otlp-traces-endpoint", trace_sink.endpoint) if trace_sink else ()
    extra_args = ("--trust-request-mm-kwargs", *tool_flags, *trace_flags, *extra_args)
    spec = demo_spec(max_model_len=max_model_len, name="test-embedded", extra_args=list(extra_args))
    with Supervisor(spec, state_dir=workdir) as supervisor:
        replica = supervisor.replicas[0]
        assert replica.pid is not None
        yield EmbeddedEngine(
            base_url=replica.plan.url,
            model=supervisor.served_model_name,
            model_path=supervisor.model_path,
            max_model_len=max_model_len,
            log_path=replica.plan.log_path,
            pid=replica.pid,
            spec=spec,
            trace_sink=trace_sink,
        )
