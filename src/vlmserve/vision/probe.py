"""Read an image's format and size from its header, without decoding its pixels.

A 50-megapixel PNG decodes into 150 MB of pixels; its header is a few dozen bytes. Limits are
checked on the header, so an image over a limit is refused before anything large is allocated
(a decompression bomb never reaches a decoder).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import warnings
from dataclasses import dataclass

_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)?((?:;[\w.+-]+=[\w.+-]+)*);base64,", re.IGNORECASE)


class ImageUnreadable(Exception):
    """The bytes are not an image a decoder can read; the message says why in one line."""


class ImageTooLarge(ImageUnreadable):
    """The header gives a size past the decoder's own hard limit."""


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header says: its format (PIL's name, lower case) and size in pixels."""

    format: str
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def base64_decoded_size(encoded_length: int) -> int:
    """Upper bound of the decoded size of `encoded_length` base64 characters (checked before decoding)."""
    return (encoded_length * 3) // 4


def split_data_url(url: str) -> tuple[str, str]:
    """(media type, base64 payload) of a base64 data URL; ImageUnreadable for anything else."""
    match = _DATA_URL.match(url)
    if not match:
        raise ImageUnreadable("data URL must look like data:image/png;base64,<data>")
    return (match.group(1) or "").lower(), url[match.end() :]


def decode_base64(payload: str) -> bytes:
    """The bytes of a base64 payload (standard alphabet, padding optional); ImageUnreadable if invalid."""
    compact = payload.strip()
    try:
        return base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ImageUnreadable("data URL does not hold valid base64") from None


def load_image_readers() -> None:
    """Import Pillow and register its format readers now.

    Done lazily, the first image a server probes pays for it (about 110 ms here: 40 ms of imports
    and 70 ms of `Image.init()` loading every format plugin) on whatever thread probes it, which
    in the gateway is the event loop: every other client would wait that long once."""
    from PIL import Image

    Image.init()


def probe_image(data: bytes, formats: tuple[str, ...] | None = None) -> ImageHeader:
    """Format and size from the header alone; ImageUnreadable when no decoder recognises it.
    `formats` (PIL's names) limits the decoders tried: some of PIL's readers (ICO's) decode
    the image at open, so a caller that must never decode names only header-reading ones."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Size limits are ours to apply, on the header; PIL's own warning is noise here.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=formats) as image:
                width, height = image.size
                kind = (image.format or "unknown").lower()
    except Image.DecompressionBombError:
        raise ImageTooLarge(
            f"image has more than {2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels (a decompression bomb by PIL's rule)"
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise ImageUnreadable(
            "not a readable image (no decoder recognised its header)"
            if formats is None
            else f"not a readable image in an accepted format ({', '.join(formats)})"
        ) from None
    if width < 1 or height < 1:
        raise ImageUnreadable(f"image header gives an empty size {width}x{height}")
    return ImageHeader(kind, width, height)


def content_digest(data: bytes) -> str:
    """A digest of the image's bytes: equal images (byte for byte) share it, whatever URL carried them."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()
