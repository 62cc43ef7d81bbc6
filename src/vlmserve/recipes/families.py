"""The recipe registry: which vLLM flags each VLM family needs, and why.

Families are recognised from config.json (`model_type` first, then `architectures`), the same
keys vLLM's own model registry uses, so a fine-tune that keeps its base's config gets its base's
recipe. Each flag carries its reason, shown by `vlmserve recipe show` and listed in docs/recipes.md.
Multimodal flags apply only where the config has a `vision_config` (a text-only checkpoint of the
same family would otherwise be given limits for inputs it cannot take).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from vlmserve.json_types import JSONObject, JSONValue

EMBEDDED_FAMILY = "embedded"
"""The recipe for vlmserve's own tiny Idefics3 model (spec model `embedded`)."""

GEMMA4_VISION_BUDGET = 280
"""Gemma 4's default `max_soft_tokens` per image (allowed: 70, 140, 280, 560, 1120)."""

QWEN3_VL_MAX_PIXELS = 1280 * 32 * 32
"""1280 vision tokens per image at Qwen3-VL's 32-pixel merged patch (16 x 2)."""

QWEN2_5_VL_MAX_PIXELS = 1280 * 28 * 28
"""1280 vision tokens per image at Qwen2.5-VL's 28-pixel merged patch (14 x 2); its processor's default."""

IMAGES_PER_PROMPT = 4
"""Images a prompt may carry under a recipe: enough for multi-image work, small enough that vLLM's
start-up memory profile (which sizes the encoder cache for the largest allowed prompt) stays modest."""

EMBEDDED_IMAGES_PER_PROMPT = 16
"""The embedded model allows what the gateway allows by default (max_images_per_request), so a
request the gateway passes is never refused by the engine behind it."""

BENCHMARK_FLAGS: dict[str, tuple[JSONValue, str]] = {
    "enable_prefix_caching": (
        False,
        "benchmark: repeated prompt prefixes must not be served from cache (it flatters TTFT); vLLM's benchmarking guidance",
    )
}
"""What a benchmark deployment changes on top of every recipe."""

FlagTable = dict[str, tuple[JSONValue, str]]
"""flag key (underscore name, as in engine_args) -> (value, why)."""


@dataclass(frozen=True)
class ModelFacts:
    """What a recipe may depend on: the model's config.json and the name it was given."""

    config: JSONObject
    name: str  # directory path or hub id, as given

    @property
    def has_vision(self) -> bool:
        return isinstance(self.config.get("vision_config"), dict)

    @property
    def has_audio(self) -> bool:
        return isinstance(self.config.get("audio_config"), dict)

    @property
    def is_thinking_variant(self) -> bool:
        """Qwen3-VL ships Instruct and Thinking checkpoints under one config; only the name tells."""
        return "thinking" in self.name.lower()


@dataclass(frozen=True)
class Recipe:
    """One family: how it is recognised and the flags it needs (a function of the model's facts)."""

    family: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    flags: Callable[[ModelFacts], FlagTable]
    source: str
    """The page or code the choices follow (docs/recipes.md repeats it)."""
    tool_chat_template: str | None = None
    """A file name the family's recipe passes as --chat-template, used when the model directory has it."""
    notes: tuple[str, ...] = field(default_factory=tuple)


def _gemma4(facts: ModelFacts) -> FlagTable:
    flags: FlagTable = {
        "reasoning_parser": ("gemma4", "Gemma 4 recipe: thinking output goes to reasoning_content"),
        "tool_call_parser": ("gemma4", "Gemma 4 recipe: Gemma 4's tool-call format"),
        "enable_auto_tool_choice": (True, "Gemma 4 recipe: the model decides when to call a tool"),
        "async_scheduling": (True, "Gemma 4 recipe: overlap scheduling with the forward pass"),
    }
    if facts.has_vision:
        if facts.has_audio:
            limits: JSONObject = {"image": IMAGES_PER_PROMPT, "audio": 1}
            why = "audio_config present: one audio clip allowed"
        else:
            limits, why = {"image": IMAGES_PER_PROMPT, "audio": 0}, "no audio_config: image-only, audio 0"
        flags["limit_mm_per_prompt"] = (limits, f"Gemma 4 recipe: {why}")
        flags["mm_processor_kwargs"] = (
            {"max_soft_tokens": GEMMA4_VISION_BUDGET},
            f"vision budget: {GEMMA4_VISION_BUDGET} soft tokens per image (Gemma 4's default; 70-1120)",
        )
    return flags


def _qwen3_vl(facts: ModelFacts) -> FlagTable:
    flags: FlagTable = {
        "tool_call_parser": ("hermes", "Qwen3-VL recipe: Qwen's Hermes-style <tool_call> format"),
        "enable_auto_tool_choice": (True, "Qwen3-VL recipe: the model decides when to call a tool"),
    }
    if facts.is_thinking_variant:
        flags["reasoning_parser"] = ("qwen3", "Qwen3-VL recipe: a Thinking checkpoint's <think> block")
    if facts.has_vision:
        flags["limit_mm_per_prompt"] = (
            {"image": IMAGES_PER_PROMPT, "video": 0},
            "Qwen3-VL recipe: image-only work, video 0 (less memory profiled)",
        )
        flags["mm_processor_kwargs"] = ({"max_pixels": QWEN3_VL_MAX_PIXELS}, "vision budget: at most 1280 tokens per image")
    return flags


def _qwen2_5_vl(facts: ModelFacts) -> FlagTable:
    flags: FlagTable = {
        "tool_call_parser": ("hermes", "Qwen2.5-VL recipe: Qwen's Hermes-style <tool_call> format"),
        "enable_auto_tool_choice": (True, "Qwen2.5-VL recipe: the model decides when to call a tool"),
    }
    if facts.has_vision:
        flags["limit_mm_per_prompt"] = (
            {"image": IMAGES_PER_PROMPT, "video": 0},
            "Qwen2.5-VL recipe: image-only work, video 0 (less memory profiled)",
        )
        flags["mm_processor_kwargs"] = (
            {"max_pixels": QWEN2_5_VL_MAX_PIXELS},
            "vision budget: at most 1280 tokens per image (the processor's default)",
        )
    return flags


def _images_only(label: str) -> Callable[[ModelFacts], FlagTable]:
    def flags(facts: ModelFacts) -> FlagTable:
        if not facts.has_vision:
            return {}
        return {"limit_mm_per_prompt": ({"image": IMAGES_PER_PROMPT}, f"{label}: images per prompt")}

    return flags


def _embedded(facts: ModelFacts) -> FlagTable:
    # vLLM 0.32 refuses `tools` with tool_choice auto (the OpenAI SDK's default) without these two,
    # and named or required tool_choice without a loaded parser. The parser costs a few ms of frontend
    # time per chat request; the OpenAI SDK's tool examples working on the default model is worth it.
    return {
        "limit_mm_per_prompt": (
            {"image": EMBEDDED_IMAGES_PER_PROMPT},
            "embedded model: as many images as the gateway allows by default",
        ),
        "tool_call_parser": ("hermes", "embedded model: <tool_call> JSON, so tool requests are accepted"),
        "enable_auto_tool_choice": (True, "embedded model: tool_choice auto, the OpenAI SDK's default"),
    }


RECIPES: tuple[Recipe, ...] = (
    Recipe(
        "gemma4",
        ("gemma4", "gemma4_text"),
        ("Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration", "Gemma4ForCausalLM"),
        _gemma4,
        source="vLLM recipes: Gemma 4 (docs.vllm.ai/projects/recipes)",
        tool_chat_template="tool_chat_template_gemma4.jinja",
    ),
    Recipe(
        "qwen3_vl",
        ("qwen3_vl", "qwen3_vl_moe"),
        ("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"),
        _qwen3_vl,
        source="vLLM recipes: Qwen3-VL; Qwen's function-calling guide (hermes)",
    ),
    Recipe(
        "qwen2_5_vl",
        ("qwen2_5_vl",),
        ("Qwen2_5_VLForConditionalGeneration",),
        _qwen2_5_vl,
        source="vLLM recipes: Qwen2.5-VL; Qwen's function-calling guide (hermes)",
    ),
    Recipe(
        "idefics3",
        ("idefics3", "smolvlm"),
        ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration"),
        _images_only("Idefics3/SmolVLM"),
        source="vLLM's multimodal docs (limit_mm_per_prompt); no tool format",
    ),
    Recipe(
        "llava",
        ("llava", "llava_next", "llava_onevision", "llava_next_video"),
        (
            "LlavaForConditionalGeneration",
            "LlavaNextForConditionalGeneration",
            "LlavaOnevisionForConditionalGeneration",
            "LlavaNextVideoForConditionalGeneration",
        ),
        _images_only("LLaVA"),
        source="vLLM's multimodal docs (limit_mm_per_prompt); no tool format",
    ),
)

EMBEDDED_RECIPE = Recipe(
    EMBEDDED_FAMILY,
    (),
    (),
    _embedded,
    source="vlmserve.engines.embedded (a tiny Idefics3; eager mode stays vlmserve's own default)",
)


def find_recipe(config: JSONObject) -> Recipe | None:
    """The recipe for a config.json: by `model_type`, else by any of its `architectures`."""
    model_type = str(config.get("model_type", "")).lower()
    for recipe in RECIPES:
        if model_type in recipe.model_types:
            return recipe
    architectures = config.get("architectures")
    names = [name for name in architectures if isinstance(name, str)] if isinstance(architectures, list) else []
    for recipe in RECIPES:
        if any(name in recipe.architectures for name in names):
            return recipe
    return None


def known_families() -> list[str]:
    """Every family with a recipe, for messages ("known: gemma4, ...")."""
    return [recipe.family for recipe in RECIPES]
