"""The image path against the real embedded vLLM engine: preflight limits and downscaling at the gateway."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from PIL import Image

from tests.helpers.gateway_fixtures import post_chat, running_gateway
from vlmserve.vision.tokens import estimator_for_model_dir


def photo_url(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.radial_gradient("L").resize((width, height)).convert("RGB").save(buffer, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_question(model: str, url: str) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 2,
        "stream": False,
        "temperature": 0,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "What is in this picture?"},
                ],
            }
        ],
    }


@pytest.mark.engine
async def test_over_max_pixels_is_refused_and_downscaling_lowers_the_engines_prompt_tokens(
    embedded_engine, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    body = image_question(embedded_engine.model, photo_url(640, 480))
    audit = tmp_path / "audit.jsonl"
    async with aiohttp.ClientSession() as session:
        async with running_gateway(
            [embedded_engine.base_url], max_image_pixels=100_000, model_config_dir=Path(embedded_engine.model_path)
        ) as strict:
            refused = await post_chat(session, strict.base_url, body)
        assert refused.status == 400, refused.body
        message = refused.body["error"]["message"]
        assert "640x480 = 307200 pixels" in message and "100000-pixel limit" in message and "--max-image-pixels" in message

        async with running_gateway([embedded_engine.base_url], model_config_dir=Path(embedded_engine.model_path)) as plain:
            full = await post_chat(session, plain.base_url, body)
        async with running_gateway(
            [embedded_engine.base_url],
            max_image_pixels=307_200,
            image_downscale_max_side=64,
            model_config_dir=Path(embedded_engine.model_path),
            audit_log=audit,
        ) as downscaling:
            small = await post_chat(session, downscaling.base_url, body)
    assert full.status == 200 and small.status == 200, (full.body, small.body)
    full_tokens, small_tokens = full.body["usage"]["prompt_tokens"], small.body["usage"]["prompt_tokens"]
    assert small_tokens < full_tokens
    image = json.loads(audit.read_text().splitlines()[-1])["images"][0]
    assert image["size"] == "640x480" and image["sent_size"] == "64x48" and image["sent_bytes"] < image["bytes"]
    # The gateway's per-model estimate predicts the engine's own count exactly: the drop is the
    # image's tokens at 640x480 minus its tokens at 64x48 with the processor's edge capped.
    estimator = estimator_for_model_dir(embedded_engine.model_path)
    expected_drop = estimator.tokens(640, 480) - estimator.tokens(64, 48, {"size": {"longest_edge": 64}})
    assert full_tokens - small_tokens == expected_drop
    assert image["tokens_estimate"] == estimator.tokens(64, 48, {"size": {"longest_edge": 64}})
