import asyncio

class RelayCore:
    fast: bool
    chunks: int
    client: asyncio.Transport | None
    usage_block: bytes
    usage_prev: bytes
    def data_received(self, data: bytes) -> None: ...
    def take_block(self, data: bytes) -> None: ...
