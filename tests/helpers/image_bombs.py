"""Small files that are costly images: what the gateway's image preflight must handle off its event loop.

- `one_bit_png(8000, 8000)`: a valid 1-bit PNG of 8000x8000 zeros in about 7.8 KB; within the
  default 64-megapixel limit, so with downscaling on it is decoded and resized (in the workers).
- `ico_holding_png(12000, 12000)`: an ICO whose one entry is such a PNG; Pillow's ICO reader
  decodes the entry when the file is opened, so a probe that opened it would decode 144 megapixels.
"""

from __future__ import annotations

import struct
import zlib


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def one_bit_png(width: int, height: int) -> bytes:
    """A complete, valid 1-bit greyscale PNG of zeros (every row: filter byte 0, then the bits)."""
    row = b"\x00" * (1 + (width + 7) // 8)
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def ico_holding_png(width: int, height: int) -> bytes:
    """An ICO file (one directory entry, size byte 0 = '256') whose image is a one_bit_png(width, height)."""
    png = one_bit_png(width, height)
    header = struct.pack("<HHH", 0, 1, 1)
    entry = struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(png), 6 + 16)
    return header + entry + png
