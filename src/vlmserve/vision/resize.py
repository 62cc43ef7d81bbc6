"""Resize an image and re-encode it as a data: URL: the gateway's downscaling, run in its image
worker processes (media/workers.py), never on its event loop.

Kept in a module of its own with no gateway imports, so a worker process starts in a fraction of
a second (a worker killed over a request's budget is replaced by a fresh one).
"""

from __future__ import annotations

import base64
import io

MIME_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp", "gif": "image/gif", "bmp": "image/bmp"}


def data_url(data: bytes, image_format: str) -> str:
    """`data:<mime>;base64,<data>` for an image of `image_format` (PIL's name, lower case)."""
    return f"data:{MIME_TYPES.get(image_format, 'image/png')};base64,{base64.b64encode(data).decode()}"


def resized_data_url(data: bytes, image_format: str, width: int, height: int) -> tuple[str, int]:
    """The image resized to (width, height) and re-encoded, as a data URL, and its encoded byte count.
    JPEG stays JPEG (quality 90), the rest become PNG (lossless, so a resize is the only change;
    fastest compression, as the bytes only travel to a nearby engine, benchmarks/image_preflight.py).
    `reducing_gap` shrinks by whole factors first, which bounds the cost of a huge source."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.draft("RGB", (width, height))  # JPEG: decode at a reduced scale when it can
        small = image.convert("RGB").resize((width, height), Image.Resampling.BICUBIC, reducing_gap=3.0)
    buffer = io.BytesIO()
    sent_format = "jpeg" if image_format == "jpeg" else "png"
    small.save(buffer, format=sent_format.upper(), **({"quality": 90} if sent_format == "jpeg" else {"compress_level": 1}))
    encoded = buffer.getvalue()
    return data_url(encoded, sent_format), len(encoded)
