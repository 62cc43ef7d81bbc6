"""Replicas that come and go: where the gateway learns its replica set at run time.

`--discover SOURCE` names one source; the static `--replica` list is kept beside it.

- `file:PATH` — replica URLs, one a line (`#` comments) or a YAML/JSON list. Polled by mtime and
  size; a new content is applied only when two polls in a row read the same text, so a file being
  written is never half-applied (writing it elsewhere and renaming it over is better still).
- `dns:NAME:PORT` — every A/AAAA record of NAME (a headless Service), as http://ADDRESS:PORT,
  re-resolved each interval.
- `k8s:NAMESPACE/SERVICE[:PORTNAME]` — the Service's EndpointSlices through the Kubernetes API
  (discovery_k8s.py).

The rules a source keeps: a read that fails (file unreadable or malformed, a URL with a bad
scheme, a name that does not resolve, an API error) keeps the previous set, logs one warning per
distinct problem and counts a `reason` in the error metric; it never stops the gateway. What a
change does to routing (readiness first, drain on removal) is the pool's job (replicas.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import yaml

from vlmserve.errors import UserError

log = logging.getLogger("vlmserve.gateway")

SOURCE_FORMS = "file:PATH, dns:NAME:PORT or k8s:NAMESPACE/SERVICE[:PORTNAME]"
_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)
_K8S_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # DNS-1123 label (namespaces, services, port names)


class DiscoveryError(Exception):
    """A read of the source failed; `reason` is the error metric's label, `message` the log line."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ReplicaSource(Protocol):
    """Where a replica set comes from. `read` returns the full current set of base URLs, or None
    when nothing changed since the last read; it raises DiscoveryError when the source is unusable."""

    description: str

    async def read(self) -> list[str] | None: ...


def replica_url_problem(url: str) -> str | None:
    """Why `url` cannot be a replica's base URL (None when it can): http(s), a host, a valid port."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        return f"{url!r} is not a URL ({err})"
    if parts.scheme not in ("http", "https"):
        return f"{url!r} must start with http:// or https://"
    if not parts.hostname:
        return f"{url!r} has no host"
    if port == 0 or parts.query or parts.fragment or parts.username is not None:
        return f"{url!r} must be scheme://host[:port][/path] (no port 0, query, fragment or user)"
    return None


def parse_replica_list(text: str, where: str) -> list[str]:
    """URLs from a file's text: a YAML/JSON list, or one URL a line. Any bad entry rejects the whole
    text (DiscoveryError 'malformed'): a set with a line missing is worse than the previous set."""
    stripped = text.strip()
    entries: list[object]
    if stripped.startswith(("[", "-", "{")):
        try:
            loaded = yaml.safe_load(stripped)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise DiscoveryError("malformed", f"{where}: not a valid YAML/JSON list{at}") from None
        if not isinstance(loaded, list):
            raise DiscoveryError("malformed", f"{where}: expected a list of replica URLs")
        entries = loaded
    else:
        entries = [line.strip() for line in text.splitlines()]
        entries = [line for line in entries if line and not str(line).startswith("#")]
    urls: list[str] = []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, str):
            raise DiscoveryError("malformed", f"{where}: entry {number} is not a URL string")
        problem = replica_url_problem(entry.strip())
        if problem is not None:
            raise DiscoveryError("malformed", f"{where}: entry {number}: {problem}")
        urls.append(entry.strip().rstrip("/"))
    return urls


@dataclass
class FileSource:
    """A file of replica URLs, applied once it reads the same twice in a row."""

    path: Path
    description: str = ""
    _applied_stat: tuple[int, int] | None = field(default=None, repr=False)
    _pending: str | None = field(default=None, repr=False)
    _first: bool = field(default=True, repr=False)

    def __post_init__(self) -> None:
        self.description = self.description or f"file:{self.path}"

    async def read(self) -> list[str] | None:
        try:
            stat = os.stat(self.path)
            if (stat.st_mtime_ns, stat.st_size) == self._applied_stat:
                return None
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            self._applied_stat = self._pending = None
            why = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
            raise DiscoveryError("unreadable", f"cannot read replica file {self.path}: {why}") from None
        if not self._first and text != self._pending:
            self._pending = text  # changed since the last poll: maybe still being written; wait a poll
            return None
        self._first = False
        self._pending = text
        urls = parse_replica_list(text, f"replica file {self.path}")
        self._applied_stat = (stat.st_mtime_ns, stat.st_size)
        return urls


@dataclass
class DnsSource:
    """Every address NAME resolves to (A and AAAA), each as http://ADDRESS:PORT."""

    name: str
    port: int
    description: str = ""

    def __post_init__(self) -> None:
        self.description = self.description or f"dns:{self.name}:{self.port}"

    async def read(self) -> list[str] | None:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(self.name, self.port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as err:
            why = err.strerror if isinstance(err, socket.gaierror) else str(err)
            raise DiscoveryError("unresolved", f"DNS name {self.name} does not resolve ({why})") from None
        addresses = {str(info[4][0]) for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)}
        return sorted(url_for(address, self.port) for address in addresses)


def url_for(address: str, port: int, scheme: str = "http") -> str:
    """http://ADDRESS:PORT, with an IPv6 address in brackets (and any %zone dropped)."""
    host = address.split("%", 1)[0]
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass  # a host name (an FQDN endpoint)
    return f"{scheme}://{host}:{port}"


def parse_source(text: str) -> ReplicaSource:
    """The source a `--discover` value names; a UserError (one line) when it names none."""
    kind, sep, rest = text.partition(":")
    bad = f"--discover {text!r}"
    if not sep or kind not in ("file", "dns", "k8s"):
        raise UserError(f"{bad}: unknown source; write {SOURCE_FORMS}")
    if kind == "file":
        if not rest.strip():
            raise UserError(f"{bad}: no path; write file:PATH")
        path = Path(rest).expanduser()
        if not path.is_file():
            raise UserError(f"{bad}: {path} is not a file; create it (one replica URL a line) or fix the path")
        return FileSource(path)
    if kind == "dns":
        name, colon, port_text = rest.rpartition(":")
        if not colon or not _HOST_NAME.match(name):
            raise UserError(f"{bad}: write dns:NAME:PORT with a host name (e.g. dns:engines.default.svc.cluster.local:8000)")
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise UserError(f"{bad}: port {port_text!r} must be a number from 1 to 65535")
        return DnsSource(name.rstrip("."), int(port_text))
    namespace, slash, service_part = rest.partition("/")
    service, colon, port_name = service_part.partition(":")
    if not slash or not _K8S_NAME.match(namespace) or not _K8S_NAME.match(service) or (colon and not _K8S_NAME.match(port_name)):
        raise UserError(
            f"{bad}: write k8s:NAMESPACE/SERVICE[:PORTNAME] with Kubernetes names (lower-case letters, digits and '-')"
        )
    from vlmserve.discovery.k8s import EndpointSliceSource  # the kubernetes client loads only when used

    return EndpointSliceSource(namespace, service, port_name or None)


class DiscoveryWatcher:
    """Reads a source every `interval_s` and hands each changed set to `apply`.

    A failed read keeps the set last applied: `on_error(reason)` counts it, and the warning is
    logged once per distinct problem (and once more when the source recovers).
    """

    def __init__(
        self,
        source: ReplicaSource,
        interval_s: float,
        apply: Callable[[Sequence[str]], None],
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.source = source
        self.interval_s = interval_s
        self.apply = apply
        self.on_error = on_error
        self.applied: list[str] | None = None
        self._last_problem: str | None = None
        self._task: asyncio.Task | None = None

    async def poll(self) -> bool:
        """One read; True when a changed set was applied. Never raises (but for cancellation)."""
        try:
            urls = await self.source.read()
        except DiscoveryError as err:
            self._failed(err.reason, err.message)
            return False
        except Exception as err:  # a bug in a source must not end discovery
            self._failed("error", f"replica source {self.source.description} failed: {type(err).__name__}: {err}")
            return False
        if self._last_problem is not None:
            log.info("replica source %s is readable again", self.source.description)
            self._last_problem = None
        if urls is None or urls == self.applied:
            return False
        self.applied = list(urls)
        self.apply(self.applied)
        return True

    def _failed(self, reason: str, message: str) -> None:
        if self.on_error is not None:
            self.on_error(reason)
        if message != self._last_problem:
            log.warning("%s; keeping the previous replica set", message)
            self._last_problem = message

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gateway-discovery")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.poll()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await _quietly(self._task)
            self._task = None
        close = getattr(self.source, "close", None)
        if close is not None:
            close()


async def _quietly(awaitable: Awaitable[object]) -> None:
    try:
        await awaitable
    except (asyncio.CancelledError, Exception):  # noqa: S110 - what it awaited was being torn down
        pass
