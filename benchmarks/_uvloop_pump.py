"""A byte pump between clients and one engine on uvloop: the floor for any Python relay.

Each client connection gets its own engine connection and every byte is passed on as it comes,
with no HTTP at all (benchmarks/gateway_overhead.py's `uvloop-pump` route). It has none of a
gateway's duties, so its CPU per chunk is what uvloop and the kernel cost by themselves.

    python benchmarks/_uvloop_pump.py ENGINE_HOST ENGINE_PORT LISTEN_PORT
    python benchmarks/_uvloop_pump.py --smoke    # bytes through the pump and back from an echo peer
"""

from __future__ import annotations

import asyncio
import sys

import uvloop


class _Upstream(asyncio.Protocol):
    def __init__(self, client: _Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        assert self.client.transport is not None
        self.client.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.client.transport is not None:
            self.client.transport.close()


class _Client(asyncio.Protocol):
    engine: tuple[str, int] = ("127.0.0.1", 0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport | None = transport  # type: ignore[assignment]
        self.upstream: _Upstream | None = None
        self.pending: list[bytes] = []
        asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        _, upstream = await asyncio.get_running_loop().create_connection(lambda: _Upstream(self), *self.engine)
        self.upstream = upstream
        for data in self.pending:
            assert upstream.transport is not None
            upstream.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if self.upstream is None or self.upstream.transport is None:
            self.pending.append(data)
        else:
            self.upstream.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()


async def _serve(port: int) -> None:
    await asyncio.get_running_loop().create_server(_Client, "127.0.0.1", port, backlog=4096)
    await asyncio.Event().wait()


async def _smoke() -> None:
    """One round trip through the pump to an echo server: the pump still relays both ways."""
    loop = asyncio.get_running_loop()

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            self.transport.write(data)

    echo = await loop.create_server(Echo, "127.0.0.1", 0)
    _Client.engine = ("127.0.0.1", echo.sockets[0].getsockname()[1])
    pump = await loop.create_server(_Client, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", pump.sockets[0].getsockname()[1])
    message = b'data: {"choices": []}\n\n' * 64
    writer.write(message)
    echoed = await asyncio.wait_for(reader.readexactly(len(message)), timeout=10)
    writer.close()
    if echoed != message:
        raise SystemExit("smoke: the pump changed the bytes it relayed")
    print(f"smoke mode: {len(message)} bytes through the pump and back")


if __name__ == "__main__":
    if sys.argv[1:] == ["--smoke"]:
        uvloop.run(_smoke())
    else:
        _Client.engine = (sys.argv[1], int(sys.argv[2]))
        uvloop.run(_serve(int(sys.argv[3])))
