"""Image preflight: every image a request carries is checked, and optionally made cheaper, before an engine sees it.

What it guarantees, per request (limits per deployment, tightened per tenant):
- At most `max_images_per_request` images (video and audio parts count as media too).
- Each inline image is at most `max_image_bytes` (checked on the base64 length, before decoding)
  and `max_image_pixels` (checked on the header: a decompression bomb is refused without being
  decoded), and its header is readable. Otherwise 400, naming the limit and the flag that sets it.
- Remote URLs (already allowed by the media policy) are fetched here with a timeout, a size cap and
  no redirects, then forwarded inline: an engine never waits on a slow remote host, and the image
  passes the same checks as an inline one.
- With `downscale_max_side`, an image is resized so its longest side is at most that, and the
  processor keyword the model family needs to keep it that small is added (vision.tokens).
  The engine's prompt tokens drop accordingly; the audit line records both sizes. The resize runs
  in the image worker processes (image_workers.py), within a time budget per request; nothing
  decodes pixels on the event loop.
- The header probe only reads headers: the decoders it may open are those of `ACCEPTED_FORMATS`,
  none of which decodes at open. Pillow's ICO reader (and CUR, ICNS and other containers) decodes
  the largest image inside at open, so such images are refused unread rather than probed: a
  header parser of our own for each container would be more code on the trust boundary for
  formats no vision client needs to send (any image converts to PNG).
Each image's content digest (of its bytes) goes to the router: image-aware routing and prefix
affinity key on it, so the same image sent twice is recognised whatever URL carried it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp

from vlmserve.json_types import JSONObject
from vlmserve.media.urls import media_slots
from vlmserve.media.workers import ImageWorkerPool, ImageWorkRefused, WorkBudget
from vlmserve.vision.probe import (
    ImageTooLarge,
    ImageUnreadable,
    base64_decoded_size,
    content_digest,
    decode_base64,
    probe_image,
    split_data_url,
)
from vlmserve.vision.resize import data_url, resized_data_url
from vlmserve.vision.tokens import ImageTokenEstimator

ACCEPTED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
"""The decoders the probe may open (PIL's names): each reads only its header at open."""
_THREAD_BYTES = 64 * 1024  # images larger than this are inspected off the event loop


@dataclass(frozen=True)
class ImageLimits:
    """What one request's images may be. Each limit names its flag in the refusal."""

    max_image_bytes: int
    max_image_pixels: int
    max_images_per_request: int

    def tightened(
        self, max_image_bytes: int | None, max_image_pixels: int | None, max_images_per_request: int | None
    ) -> ImageLimits:
        """A tenant's limits can only be stricter than the deployment's."""
        return ImageLimits(
            min(self.max_image_bytes, max_image_bytes or self.max_image_bytes),
            min(self.max_image_pixels, max_image_pixels or self.max_image_pixels),
            min(self.max_images_per_request, max_images_per_request or self.max_images_per_request),
        )


class ImageRefused(Exception):
    """An image the preflight refuses; carries the OpenAI-format error's code (and a status: 400,
    or 503 with Retry-After when the image workers are too busy to take it)."""

    def __init__(self, message: str, code: str = "invalid_image", status: int = 400, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.retry_after_s = retry_after_s


@dataclass
class ImageSeen:
    """One image as received and as forwarded (for the audit log and the router)."""

    index: int
    digest: str
    format: str
    width: int
    height: int
    bytes: int
    source: str  # "inline" or "fetched"
    sent_width: int = 0
    sent_height: int = 0
    sent_bytes: int = 0
    tokens: int = 0  # estimated prompt tokens, as forwarded

    def audit(self) -> dict[str, object]:
        return {
            "digest": self.digest,
            "format": self.format,
            "source": self.source,
            "size": f"{self.width}x{self.height}",
            "bytes": self.bytes,
            "sent_size": f"{self.sent_width}x{self.sent_height}",
            "sent_bytes": self.sent_bytes,
            "tokens_estimate": self.tokens,
        }


@dataclass
class PreflightResult:
    images: list[ImageSeen] = field(default_factory=list)
    other_media: int = 0
    changed: bool = False  # the body must be re-encoded before forwarding

    @property
    def digests(self) -> list[str]:
        return [image.digest for image in self.images]

    @property
    def image_tokens(self) -> int:
        return sum(image.tokens for image in self.images)


TEXT_ONLY = PreflightResult()
"""The result for a body that names no media (shared by every such request: never mutated)."""


class RemoteFetcher:
    """GETs allowed remote media with a deadline and a size cap, never following redirects."""

    def __init__(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        self.session = session
        self.timeout_s = timeout_s

    async def fetch(self, url: str, max_bytes: int, index: int) -> bytes:
        shown = url[:80]
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self.session.get(url, allow_redirects=False) as response:
                    if response.status != 200:
                        raise ImageRefused(
                            f"image {index}: {shown} answered HTTP {response.status}"
                            f"{' (a redirect: link the final URL)' if 300 <= response.status < 400 else ''}",
                            "media_fetch_failed",
                        )
                    if response.content_length is not None and response.content_length > max_bytes:
                        raise _too_many_bytes(index, response.content_length, max_bytes)
                    data = bytearray()
                    async for chunk in response.content.iter_chunked(65536):
                        data += chunk
                        if len(data) > max_bytes:
                            raise _too_many_bytes(index, len(data), max_bytes, at_least=True)
                    return bytes(data)
        except TimeoutError:
            raise ImageRefused(
                f"image {index}: {shown} did not answer within {self.timeout_s:g} s "
                "(--media-fetch-timeout): send the image inline as a data: URL",
                "media_fetch_failed",
            ) from None
        except aiohttp.ClientError as err:
            raise ImageRefused(
                f"image {index}: fetching {shown} failed ({type(err).__name__}): send the image inline", "media_fetch_failed"
            ) from None


def _too_many_bytes(index: int, size: int, limit: int, at_least: bool = False) -> ImageRefused:
    more = "more than " if at_least else ""
    return ImageRefused(
        f"image {index} is {more}{size} bytes, over the {limit}-byte limit (--max-image-bytes): "
        "send a smaller or more compressed image",
        "image_too_large",
    )


class ImagePreflight:
    """Runs the checks above over one parsed request body, rewriting it in place where needed."""

    def __init__(
        self,
        limits: ImageLimits,
        estimator: ImageTokenEstimator,
        *,
        downscale_max_side: int | None = None,
        fetcher: RemoteFetcher | None = None,
        client_processor_kwargs: tuple[str, ...] = (),
        pool: ImageWorkerPool | None = None,
    ) -> None:
        self.client_processor_kwargs = client_processor_kwargs
        self.limits = limits
        self.estimator = estimator
        self.downscale_max_side = downscale_max_side
        self.fetcher = fetcher
        self.pool = pool if pool is not None or downscale_max_side is None else ImageWorkerPool()

    async def run(
        self, payload: JSONObject, limits: ImageLimits | None = None, *, takes_processor_kwargs: bool = True
    ) -> PreflightResult:
        """Check every media part of `payload`; ImageRefused for the first that breaks a rule."""
        limits = limits or self.limits
        self.check_client_kwargs(payload)
        result = PreflightResult()
        slots = list(media_slots(payload))
        if len(slots) > limits.max_images_per_request:
            raise ImageRefused(
                f"request has {len(slots)} images or other media parts, over the limit of "
                f"{limits.max_images_per_request} per request (--max-images-per-request)",
                "too_many_images",
            )
        kwargs: JSONObject = {}
        budget: list[WorkBudget] = []  # the request's image-work budget, made by its first resize
        for index, (kind, holder, key) in enumerate(slots, start=1):
            url = holder[key]
            if not isinstance(url, str):  # never: media_slots yields string slots only
                continue
            if kind != "image":
                result.other_media += 1
                if url[:5].lower() == "data:" and base64_decoded_size(len(url)) > limits.max_image_bytes:
                    raise _too_many_bytes(index, base64_decoded_size(len(url)), limits.max_image_bytes)
                continue
            data, source = await self._image_bytes(url, limits, index)
            seen, new_url, extra = await self._inspect(data, source, limits, index, budget)
            if new_url is not None:
                holder[key] = new_url
                result.changed = True
            for name, value in extra.items():
                held = kwargs.get(name)
                kwargs[name] = max(held, value) if isinstance(value, int) and isinstance(held, (int, float)) else value
            result.images.append(seen)
        if kwargs and takes_processor_kwargs:
            given = payload.get("mm_processor_kwargs")
            merged = {**kwargs, **given} if isinstance(given, dict) else kwargs  # the client's own choice wins
            if merged != given:
                payload["mm_processor_kwargs"] = merged
                result.changed = True
        sent = payload.get("mm_processor_kwargs")  # an object or absent: check_client_kwargs refused the rest
        for seen in result.images:
            seen.tokens = self.estimator.tokens(seen.sent_width, seen.sent_height, sent if isinstance(sent, dict) else None)
        return result

    def check_client_kwargs(self, payload: JSONObject) -> None:
        """Engines behind the gateway trust per-request processor kwargs (the gateway adds its own when
        downscaling), so only the keys the operator allows may come from a client: a kwarg such as
        an image size can multiply an engine's preprocessing and encoder work."""
        given = payload.get("mm_processor_kwargs")
        if given is not None:
            if not isinstance(given, dict):
                raise ImageRefused("'mm_processor_kwargs' must be an object", "invalid_mm_processor_kwargs")
            refused = sorted(set(given) - set(self.client_processor_kwargs))
            if refused:
                allowed = ", ".join(self.client_processor_kwargs) or "none"
                raise ImageRefused(
                    f"mm_processor_kwargs key {refused[0]!r} is not allowed through this gateway (allowed: "
                    f"{allowed}; --client-mm-processor-kwargs)",
                    "mm_processor_kwargs_not_allowed",
                )
        if payload.get("media_io_kwargs") is not None:
            raise ImageRefused(
                "media_io_kwargs are set by the operator, not per request: drop the field", "mm_processor_kwargs_not_allowed"
            )

    async def _image_bytes(self, url: str, limits: ImageLimits, index: int) -> tuple[bytes, str]:
        if url[:5].lower() != "data:":
            if self.fetcher is None:
                raise ImageRefused(
                    f"image {index}: remote URLs are not fetched by this gateway: send the image inline", "media_url_not_allowed"
                )
            return await self.fetcher.fetch(url, limits.max_image_bytes, index), "fetched"
        try:
            _, payload = split_data_url(url)
        except ImageUnreadable as err:
            raise ImageRefused(f"image {index}: {err}") from None
        if base64_decoded_size(len(payload)) > limits.max_image_bytes + 2:
            raise _too_many_bytes(index, base64_decoded_size(len(payload)), limits.max_image_bytes)
        try:
            data = decode_base64(payload) if len(payload) < _THREAD_BYTES else await asyncio.to_thread(decode_base64, payload)
        except ImageUnreadable as err:
            raise ImageRefused(f"image {index}: {err}") from None
        if len(data) > limits.max_image_bytes:
            raise _too_many_bytes(index, len(data), limits.max_image_bytes)
        return data, "inline"

    async def _inspect(
        self, data: bytes, source: str, limits: ImageLimits, index: int, budget: list[WorkBudget]
    ) -> tuple[ImageSeen, str | None, JSONObject]:
        """(what the image is, its new URL if it changed, processor kwargs to add)."""
        try:
            header = probe_image(data, ACCEPTED_FORMATS)
        except ImageTooLarge as err:
            raise ImageRefused(
                f"image {index}: {err}, over the {limits.max_image_pixels}-pixel limit (--max-image-pixels)", "image_too_large"
            ) from None
        except ImageUnreadable as err:
            raise ImageRefused(
                f"image {index}: {err}; formats other than PNG, JPEG, WebP, GIF and BMP (ICO, "
                "TIFF and other containers) are refused unread: send a PNG, JPEG, WebP or GIF"
            ) from None
        if header.pixels > limits.max_image_pixels:
            raise ImageRefused(
                f"image {index} is {header.width}x{header.height} = {header.pixels} pixels, over the "
                f"{limits.max_image_pixels}-pixel limit (--max-image-pixels): send a smaller image",
                "image_too_large",
            )
        seen = ImageSeen(
            index,
            content_digest(data),
            header.format,
            header.width,
            header.height,
            len(data),
            source,
            header.width,
            header.height,
            len(data),
        )
        new_url: str | None = None
        kwargs: JSONObject = {}
        if self.downscale_max_side is not None:
            plan = self.estimator.downscale(header.width, header.height, self.downscale_max_side)
            kwargs = plan.mm_processor_kwargs
            if (plan.width, plan.height) != (header.width, header.height):
                assert self.pool is not None  # made with downscale_max_side
                if not budget:
                    budget.append(self.pool.budget())
                try:
                    new_url, sent_bytes = await self.pool.run(
                        resized_data_url, (data, header.format, plan.width, plan.height), budget[0], f"image {index}"
                    )
                except ImageWorkRefused as refused:
                    raise ImageRefused(refused.message, refused.code, refused.status, refused.retry_after_s) from None
                seen.sent_width, seen.sent_height, seen.sent_bytes = plan.width, plan.height, sent_bytes
        if source == "fetched" and new_url is None:
            new_url = (
                data_url(data, header.format)
                if len(data) < _THREAD_BYTES
                else await asyncio.to_thread(data_url, data, header.format)
            )
        return seen, new_url, kwargs
