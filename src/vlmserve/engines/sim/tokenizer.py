"""A cheap deterministic tokenizer and output vocabulary for the simulated engine.

Real token ids do not matter to the simulation; what matters is that the same text
always gives the same ids (so prefix caching works on repeated prompts, in every
process), that token counts are in a realistic range (about 1.3 tokens per English
word), and that generated text re-tokenizes to the ids that were generated (so a
multi-turn conversation that sends the answer back hits the cache as in vLLM).

Pieces: a word of up to 8 letters with an optional leading space, up to 3 digits,
one other character, a run of newlines, or a run of other whitespace. A piece's id
is its CRC-32 modulo the vocabulary size.
"""

from __future__ import annotations

import re
import zlib

VOCAB_SIZE = 200_000
IMAGE_TOKEN_BASE = VOCAB_SIZE
"""Image placeholder ids live above the text vocabulary."""

_PIECE = re.compile(r" ?[A-Za-z]{1,8}| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]|\n+|[^\S\n]+")


def tokenize_pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


def encode(text: str) -> list[int]:
    """Token ids of `text` (deterministic across processes and runs)."""
    crc32 = zlib.crc32
    return [crc32(piece.encode()) % VOCAB_SIZE for piece in _PIECE.findall(text)]


def count_tokens(text: str) -> int:
    return len(_PIECE.findall(text))


def image_token_ids(digest: int, count: int) -> list[int]:
    """Placeholder ids of one image: equal images (same digest) give equal ids."""
    base = IMAGE_TOKEN_BASE + (digest % (1 << 40)) * 4096
    return list(range(base, base + count))


_SYLLABLES = (
    "ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "di", "ga", "pe", "zu", "ro", "li", "ma", "no",
    "ba", "fe", "hu", "ti", "an", "el", "or", "is",
)  # fmt: skip


def _build_output_words() -> list[str]:
    """A fixed list of pseudo-words (no letters beyond 8, so each is exactly one piece)."""
    words: list[str] = []
    for first in _SYLLABLES:
        words.append(" " + first)
        for second in _SYLLABLES:
            words.append(" " + first + second)
    for first in _SYLLABLES[:12]:
        for second in _SYLLABLES[:12]:
            for third in _SYLLABLES[:8]:
                words.append(" " + first + second + third)
    return words


OUTPUT_WORDS: list[str] = _build_output_words()
"""What the engine 'generates': pseudo-words, plus punctuation below."""
OUTPUT_PUNCTUATION: list[str] = [",", "."]
OUTPUT_PIECES: list[str] = OUTPUT_WORDS + OUTPUT_PUNCTUATION
OUTPUT_PIECE_IDS: list[int] = [encode(piece)[0] for piece in OUTPUT_PIECES]
