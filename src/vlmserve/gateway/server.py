"""Ways to run a gateway: in the foreground (CLI, `serve_forever`), or in a running event loop (tests,
embedding: `start_gateway`).

Both bind the socket before reporting ready, check the replicas once, and on stop drain:
the listening socket closes, idle connections close, in-progress requests get up to
`drain_timeout_s` to finish, then what is still open closes. The socket is served by the one
HTTP server (vlmserve.http1.server: its limits come from GatewayConfig) and speaks HTTPS when a
certificate is configured; a bad certificate or key is a one-line error before anything binds.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
from collections.abc import Callable
from dataclasses import dataclass

from vlmserve.gateway.app import Gateway
from vlmserve.gateway.config import GatewayConfig
from vlmserve.gateway.openai_errors import error_response
from vlmserve.gateway.workers import listen_error
from vlmserve.http1.server import HttpServer, ServerLimits
from vlmserve.http1.tls import server_ssl_context
from vlmserve.quiet_gc import quiet_garbage_collector

log = logging.getLogger("vlmserve.gateway")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it is installed (a declared dependency on Linux and macOS: faster socket I/O on
    the hot path), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


@dataclass
class RunningGateway:
    """A started gateway inside a running event loop."""

    listener: asyncio.Server
    http: HttpServer
    gateway: Gateway
    port: int

    @property
    def base_url(self) -> str:
        scheme = "https" if self.gateway.config.ssl_certfile else "http"
        return f"{scheme}://{self.gateway.config.host}:{self.port}"

    async def stop(self) -> None:
        """Stop listening, drain (module docstring), then stop the gateway's parts."""
        self.listener.close()
        self.http.close_idle()
        await self.gateway.drain(self.gateway.config.drain_timeout_s)
        self.http.close_all()
        await self.gateway.stop()


async def start_gateway(config: GatewayConfig, reuse_port: bool = False) -> RunningGateway:
    """Build, bind and start a gateway in the current event loop; port 0 picks a free port.

    `reuse_port`: listen with SO_REUSEPORT beside other workers on the same port (workers.py)."""
    ssl_context = server_ssl_context(config.ssl_certfile, config.ssl_keyfile)
    gateway = Gateway(config)
    await gateway.start()
    limits = ServerLimits(
        max_body_bytes=config.max_body_bytes,
        header_timeout_s=config.header_timeout_s,
        keepalive_timeout_s=config.keepalive_timeout_s,
        max_connections=config.max_connections,
        body_hint="send smaller images or raise --max-body-bytes",
    )
    http = HttpServer(gateway.dispatch, limits, error_response, gateway.client_stats)
    try:
        listener = await asyncio.get_running_loop().create_server(
            http,
            config.host,
            config.port,
            ssl=ssl_context,
            backlog=4096,
            reuse_port=reuse_port or None,
            ssl_handshake_timeout=config.header_timeout_s if ssl_context is not None else None,
        )
    except OSError as err:
        http.close_all()
        await gateway.stop()
        raise listen_error(config.host, config.port, err) from None
    port = listener.sockets[0].getsockname()[1] if listener.sockets else config.port
    return RunningGateway(listener, http, gateway, port)


def ensure_file_descriptors(max_connections: int) -> None:
    """Raise the soft open-file limit to cover `max_connections` (two fds each, plus slack), or warn."""
    if not max_connections:
        return
    want = 2 * max_connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning(
            "open-file limit %d is below the %d that --max-connections %d needs: raise `ulimit -n` or lower --max-connections",
            soft,
            want,
            max_connections,
        )


def serve_forever(config: GatewayConfig, on_ready: Callable[[int], None] | None = None, reuse_port: bool = False) -> None:
    """Run until SIGINT/SIGTERM, then drain and exit (the `vlmserve gateway` command, or one worker of it)."""

    async def main() -> None:
        ensure_file_descriptors(config.max_connections)
        running = await start_gateway(config, reuse_port=reuse_port)
        quiet_garbage_collector()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if on_ready is not None:
            on_ready(running.port)
        await stop.wait()
        log.info("draining: waiting up to %.0f s for requests in progress", config.drain_timeout_s)
        await running.stop()

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main())
