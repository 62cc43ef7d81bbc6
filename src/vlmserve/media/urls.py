"""Media policy: which media URLs in a request body may reach an engine (which would fetch them).

The rules this module keeps:
- Every `image_url`, `video_url`, `audio_url`, `input_image` and `file_url` field anywhere in
  the body is checked (chat messages, /v1/responses input items, /tokenize, pooling inputs),
  as a string or as `{"url": ...}`.
- `data:` URLs pass (the media is inline; nothing is fetched).
- `http:`/`https:` URLs pass only when their host is on `allowed_media_domains`, compared
  exactly as vLLM's `--allowed-media-domains` does: the URL's hostname must equal a listed
  entry (case-insensitive here); subdomains do not match. The list is empty by default, so
  by default no remote URL passes (vLLM's own empty default means the opposite: all pass).
- URLs that parsers could read differently are refused even for a listed host: user-info
  (`user@host`), backslashes, whitespace or control characters, an unparseable host or port.
- Every other scheme (`file:`, `ftp:`, none at all, ...) is refused.
- A listed host must also resolve to public addresses only (media_addresses.py, async: it resolves).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit

from vlmserve.json_types import JSONObject, JSONValue

MEDIA_URL_FIELDS = ("image_url", "video_url", "audio_url", "input_image", "file_url")
FLAG = "--allowed-media-domains"

_HOSTNAME = re.compile(r"[a-z0-9.-]+|[0-9a-f:.]+")  # a DNS name, an IPv4 or (unbracketed) IPv6 address
_UNSAFE_CHAR = re.compile(r"[\x00-\x20\x7f\\]")


class MediaRefused(Exception):
    """A media URL the policy does not allow; the message names the way out."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def may_hold_media(body: bytes) -> bool:
    """False when the raw body cannot name a media field, so the walks over the parsed body can be
    skipped (most requests are text). Every media field name is spelled out in the raw JSON unless
    escaped, and an escape needs `\\u`: a body with either keeps the full checks. (`find`, not `in`:
    CPython 3.11's `bytes in bytes` builds and drops a TypeError first, relay.py's docstring.)"""
    return body.find(b"_url") >= 0 or body.find(b"input_image") >= 0 or body.find(b"\\u") >= 0


def media_slots(payload: JSONValue) -> Iterator[tuple[str, JSONObject, str]]:
    """(kind, holder, key) for every media URL in a parsed JSON body: `holder[key]` is the URL string.

    `kind` is image, video, audio or file. Walked without recursion, in document order, so the
    n-th slot is the n-th media part the client sent (error messages number them that way).
    """
    stack: list[JSONValue] = [payload]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for name in MEDIA_URL_FIELDS:
                value = node.get(name)
                if isinstance(value, dict) and isinstance(value.get("url"), str):
                    yield _kind(name), value, "url"
                elif isinstance(value, str):
                    yield _kind(name), node, name
            stack.extend(reversed([value for value in node.values() if isinstance(value, (dict, list))]))
        elif isinstance(node, list):
            stack.extend(reversed([value for value in node if isinstance(value, (dict, list))]))


def media_urls(payload: JSONValue) -> Iterator[tuple[str, str]]:
    """(field, url) for every media URL field in a parsed JSON body."""
    for kind, holder, key in media_slots(payload):
        url = holder[key]
        if isinstance(url, str):  # always: media_slots yields string slots only
            yield (_FIELD_OF_KIND.get(kind, "image_url") if key == "url" else key), url


def _kind(field: str) -> str:
    return {"video_url": "video", "audio_url": "audio", "file_url": "file"}.get(field, "image")


_FIELD_OF_KIND = {"video": "video_url", "audio": "audio_url", "file": "file_url"}


def check_media_url(field: str, url: str, allowed_hosts: frozenset[str]) -> str | None:
    """Raise MediaRefused unless the policy lets an engine fetch `url`; its host when it is remote
    (whose addresses media_addresses.py checks next: a listed name may still point inside)."""
    scheme = url[: url.find(":")].lower() if ":" in url[:16] else ""
    if scheme == "data":
        return None
    kind = _kind(field)
    if scheme not in ("http", "https"):
        raise MediaRefused(
            f"{kind} URL scheme {scheme or 'missing'!r} is not allowed: send the {kind} inline as a "
            f"data: URL, or as an http(s) URL on a host listed in {FLAG}"
        )
    if _UNSAFE_CHAR.search(url):
        raise MediaRefused(f"{kind} URL contains a backslash, space or control character: percent-encode it")
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 -- raises ValueError for a bad port
    except ValueError:
        raise MediaRefused(f"{kind} URL {url[:80]!r} cannot be parsed: send a plain http(s) URL or a data: URL") from None
    if "@" in parts.netloc or not _HOSTNAME.fullmatch(host):
        raise MediaRefused(f"{kind} URL {url[:80]!r} has user-info or an unusual host: send a plain http(s) URL or a data: URL")
    if host not in allowed_hosts:
        raise MediaRefused(
            f"{kind} URL host {host!r} is not allowed: send the {kind} inline as a data: URL, "
            f"or ask the operator to add the host to {FLAG}"
        )
    return host


def allowed_host_set(domains: Iterable[str]) -> frozenset[str]:
    """The configured allowlist as the checks compare it (lower case, brackets off IPv6)."""
    return frozenset(domain.strip().lower().strip("[]") for domain in domains if domain.strip())


def check_media(payload: JSONValue, allowed_hosts: frozenset[str]) -> list[tuple[str, str]]:
    """Raise MediaRefused for the first media URL in `payload` the policy does not allow; else the
    (kind, host) of each remote URL, once per host, for the address check (media_addresses.py)."""
    remote: dict[str, str] = {}
    for field, url in media_urls(payload):
        host = check_media_url(field, url, allowed_hosts)
        if host is not None and host not in remote:
            remote[host] = _kind(field)
    return [(kind, host) for host, kind in remote.items()]
