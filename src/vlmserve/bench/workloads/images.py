"""images: prompts with synthetic images or images from a folder, sent as data URLs.

Synthetic images are random noise (incompressible, so a JPEG's size is realistic)
of a given size and format. Image tokens come back from the server's usage; the
requested prompt length covers the text only.
"""

from __future__ import annotations

import base64
import io
import random
from pathlib import Path

from vlmserve.bench.workloads import Conversation, Turn, WorkloadContext, require_image_dir
from vlmserve.bench.workloads.image_reuse import ImagePicker, weighted_choice
from vlmserve.bench.workloads.text import fit_prompt
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp"}
_MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp", "gif": "image/gif", "bmp": "image/bmp"}


def synthetic_image_url(rng: random.Random, size: tuple[int, int], image_format: str) -> str:
    """A data URL of a noise image of `size` (width, height) in PNG or JPEG."""
    from PIL import Image

    width, height = size
    noise = rng.randbytes(width * height * 3)
    image = Image.frombytes("RGB", (width, height), noise)
    buffer = io.BytesIO()
    pil_format = "JPEG" if image_format == "jpeg" else "PNG"
    image.save(buffer, format=pil_format, **({"quality": 90} if pil_format == "JPEG" else {}))
    return f"data:{_MIME[image_format]};base64,{base64.b64encode(buffer.getvalue()).decode()}"


def folder_image_urls(folder: str | Path) -> tuple[list[str], list[str]]:
    """Data URLs of every readable image in a folder; (urls, one line per unreadable file)."""
    from PIL import Image, UnidentifiedImageError

    path = require_image_dir(str(folder))
    urls: list[str] = []
    skipped: list[str] = []
    for file in sorted(path.iterdir()):
        if file.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        try:
            data = file.read_bytes()
            with Image.open(io.BytesIO(data)) as image:
                image.load()
                kind = (image.format or "png").lower()
        except (OSError, UnidentifiedImageError, ValueError):
            skipped.append(file.name)
            continue
        urls.append(f"data:{_MIME.get(kind, 'image/png')};base64,{base64.b64encode(data).decode()}")
    if not urls:
        reason = f" ({len(skipped)} unreadable: {', '.join(skipped[:3])})" if skipped else ""
        raise UserError(f"--image-dir {path}: no readable images{reason}; add PNG or JPEG files")
    return urls, skipped


def image_content(text: str, urls: list[str]) -> list[JSONObject]:
    """OpenAI content parts: the images first, then the question."""
    parts: list[JSONObject] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    parts.append({"type": "text", "text": text})
    return parts


def build(context: WorkloadContext, count: int) -> list[Conversation]:
    load = context.load
    if load.api != "chat":
        raise UserError("--dataset images needs --api chat (the completions API takes no images)")
    pool: list[str] | None = None
    if load.image_urls:
        pool = list(load.image_urls)
    elif load.image_dir:
        pool, skipped = folder_image_urls(load.image_dir)
        if skipped:
            context.notices.append(
                f"images: {len(pool)} images from {load.image_dir}; skipped {len(skipped)} unreadable "
                f"({', '.join(skipped[:3])}{'...' if len(skipped) > 3 else ''})"
            )
    sizes = load.image_size_mix or [(*load.image_size, 1.0)]

    def fresh_synthetic() -> str:
        width, height, _ = context.rng.choices(sizes, [weight for *_, weight in sizes])[0]
        return synthetic_image_url(context.rng, (width, height), load.image_format)

    picker = ImagePicker(
        context.rng, fresh_synthetic, repeat_rate=load.image_repeat_rate, skew=load.image_popularity_skew, pool=pool
    )
    conversations: list[Conversation] = []
    for index in range(count):
        text, _ = fit_prompt(context.rng, context.counter, load.api, load.input_len)
        images = weighted_choice(context.rng, load.images_per_request_mix, load.images_per_request)
        urls, repeat = picker.pick(images)
        budget = weighted_choice(context.rng, load.vision_budget_mix, 0)
        conversations.append(
            Conversation(
                conversation_id=f"images-{index}",
                workload="images",
                turns=[
                    Turn(
                        content=image_content(text, urls),
                        max_tokens=load.output_len,
                        requested_prompt_tokens=load.input_len,
                        requested_output_tokens=load.output_len,
                        image_count=len(urls),
                        request_type=request_type(len(urls)),
                        image_repeat=repeat if urls else None,
                        mm_processor_kwargs={"max_soft_tokens": budget} if budget else None,
                    )
                ],
            )
        )
    if load.image_repeat_rate is not None:
        sent = [c.turns[0].image_repeat for c in conversations if c.turns[0].image_count]
        achieved = sum(bool(flag) for flag in sent) / len(sent) if sent else 0.0
        context.notices.append(
            f"images: repeat rate {load.image_repeat_rate:.2f} stated, {achieved:.2f} in this workload "
            f"({len(picker.sent)} distinct images over {len(sent)} image requests, popularity skew {load.image_popularity_skew:g})"
        )
    if picker.pool_exhausted:
        context.notices.append(f"images: the {len(pool or [])} images given ran out; later 'new' images repeat earlier ones")
    return conversations


def request_type(images: int) -> str:
    """The per-type figures' key for a request with this many images."""
    return "text" if images == 0 else "image" if images == 1 else "multi-image"
