"""Image headers are read without decoding pixels; bad data gets one-line reasons."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest
from PIL import Image

from vlmserve.vision.probe import ImageTooLarge, ImageUnreadable, content_digest, decode_base64, probe_image, split_data_url


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims a size its (absent) pixel data never backs: a bomb's shape."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def test_probe_reads_format_and_size() -> None:
    header = probe_image(_png(300, 200))
    assert (header.format, header.width, header.height, header.pixels) == ("png", 300, 200, 60000)


def test_probe_reads_a_huge_claimed_size_without_decoding() -> None:
    header = probe_image(_png_header_only(12000, 12000))  # 144 MP claimed: the header alone is read
    assert (header.width, header.height, header.pixels) == (12000, 12000, 144_000_000)


def test_probe_past_pils_hard_limit_is_too_large() -> None:
    with pytest.raises(ImageTooLarge, match="decompression bomb"):
        probe_image(_png_header_only(60000, 60000))


@pytest.mark.parametrize("data", [b"", b"hello world", b"\x89PNG\r\n\x1a\n" + b"\x00" * 10])
def test_probe_refuses_non_images(data: bytes) -> None:
    with pytest.raises(ImageUnreadable, match="not a readable image"):
        probe_image(data)


def test_data_url_parsing() -> None:
    payload = base64.b64encode(b"abc").decode()
    assert split_data_url(f"data:image/png;base64,{payload}") == ("image/png", payload)
    assert decode_base64(payload.rstrip("=")) == b"abc"
    with pytest.raises(ImageUnreadable, match="must look like data:image/png;base64"):
        split_data_url("data:image/png,rawbytes")
    with pytest.raises(ImageUnreadable, match="valid base64"):
        decode_base64("!!!not base64!!!")


def test_digest_follows_bytes_not_urls() -> None:
    data = _png(8, 8)
    assert content_digest(data) == content_digest(bytes(data))
    assert content_digest(data) != content_digest(_png(8, 9))
