"""What every platform target (llm-d, production-stack, KServe) takes from a DeploymentSpec, and
what it must leave behind.

On those platforms the platform's own router stands where vlmserve's gateway stood, so the engine
is the only vlmserve part that travels: the same `vllm serve` flags `vlmserve up` passes (the
model family's recipe included, through the same launcher), the replica count and the autoscaling
rule. The gateway's work does not travel: API keys and per-tenant limits, TLS at the gateway, the
audit log, the image checks before an engine sees a request. This module says so once for all
three targets: a spec that asks for one of the trust settings is refused (one line) unless
`--drop-gateway-settings` says the platform's own gateway will do that job, and every dropped
setting is a warning on stderr and a comment at the top of what is written.

The one image limit an engine can enforce itself travels: `max_images_per_request` caps vLLM's
`--limit-mm-per-prompt` image count (vLLM answers 400 for a request with more).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from vlmserve.errors import UserError
from vlmserve.json_types import JSONValue
from vlmserve.spec import DeploymentSpec

LIMIT_MM_FLAG = "--limit-mm-per-prompt"
POD_FLAGS = ("--model", "--host", "--port")  # the platform's pod template sets these itself
TRUST_SETTINGS = ("keys_file", "ssl_certfile", "audit_log")
DROP_FLAG = "--drop-gateway-settings"
_GATEWAY_IMAGE_CHECKS = ("max_image_bytes", "max_image_pixels", "image_downscale_max_side")

ALWAYS_LEFT_BEHIND = (
    "admission control (per-tenant API keys, rate limits, token budgets, the bounded priority queue)",
    "the audit log (one JSON line per request)",
    "image checks before an engine sees a request (byte and pixel limits, downscaling)",
    "vlmserve's retries, ejection and drain of a failing engine pod",
)
"""What vlmserve's gateway does that no target here can be told to do: written into every output."""


@dataclass
class PlatformEngine:
    """The engine as a platform target carries it: `args` are the vLLM flags without the ones the
    pod template sets (model, host, port); `notes` are what to print (recipe, warnings)."""

    spec: DeploymentSpec  # the spec with its gateway off: nothing in front of the engines checks requests
    args: list[str]
    notes: list[str] = field(default_factory=list)
    left_behind: list[str] = field(default_factory=list)  # the comment block: what this output does not do


def flag_value(args: list[str], flag: str) -> str | None:
    """The value after `flag` in an argv, or None."""
    return args[args.index(flag) + 1] if flag in args else None


def without_flags(args: list[str], flags: tuple[str, ...]) -> list[str]:
    """`args` less each of `flags` and the value after it."""
    out: list[str] = []
    skip = False
    for item in args:
        if skip:
            skip = False
        elif item in flags:
            skip = True
        else:
            out.append(item)
    return out


def cap_images(args: list[str], max_images: int | None) -> list[str]:
    """`max_images_per_request` as vLLM's own limit: the image count in --limit-mm-per-prompt is
    at most it (the recipe's other modalities kept)."""
    if max_images is None:
        return args
    current = flag_value(args, LIMIT_MM_FLAG)
    parsed: JSONValue = json.loads(current) if current else {}
    limits = parsed if isinstance(parsed, dict) else {}
    image = limits.get("image")
    if isinstance(image, int) and image <= max_images:
        return args
    limits["image"] = max_images
    text = json.dumps(limits, separators=(",", ":"))
    if current is None:
        return [*args, LIMIT_MM_FLAG, text]
    out = list(args)
    out[out.index(LIMIT_MM_FLAG) + 1] = text
    return out


def check_platform_spec(spec: DeploymentSpec, platform: str, drop_gateway_settings: bool) -> list[str]:
    """Refuse (one line) a spec whose keys, TLS or audit log the platform would silently lose;
    with --drop-gateway-settings, a warning per setting instead. Returns the warnings."""
    given = [name for name in TRUST_SETTINGS if getattr(spec, name)]
    if given and not drop_gateway_settings:
        raise UserError(
            f"{platform} has no vlmserve gateway to carry {', '.join(given)}; configure "
            f"{'them' if len(given) > 1 else 'it'} on the platform's own gateway and pass {DROP_FLAG}, "
            "or export with `vlmserve export k8s` (router vlmserve)"
        )
    warnings = [
        f"warning: {platform}: {name} is not carried (no vlmserve gateway); the platform's gateway must do that job"
        for name in given
    ]
    checks = [name for name in _GATEWAY_IMAGE_CHECKS if getattr(spec, name) is not None]
    if checks:
        warnings.append(f"warning: {platform}: {', '.join(checks)} not enforced: nothing checks images before the engine there")
    if spec.gateway_state:
        warnings.append(f"warning: {platform}: gateway_state (shared rate limits) is not carried")
    return warnings


def gateway_off(spec: DeploymentSpec) -> DeploymentSpec:
    """The spec as a platform runs it: no vlmserve gateway, so the replicas are the door and must
    not trust per-request processor kwargs (the engine flags follow `gateway: false`)."""
    return spec.model_copy(
        update={"gateway": False, "keys_file": None, "ssl_certfile": None, "ssl_keyfile": None, "audit_log": None}
    )


def left_behind(spec: DeploymentSpec) -> list[str]:
    """The comment block's lines: what vlmserve's gateway did, and the spec's settings not carried."""
    return [*ALWAYS_LEFT_BEHIND, *(f"{name} from the spec (not carried)" for name in TRUST_SETTINGS if getattr(spec, name))]


def platform_engine(spec: DeploymentSpec, model_in_pod: str, platform: str, *, drop_gateway_settings: bool) -> PlatformEngine:
    """The vLLM flags (recipe applied, as `up` would pass them) for a platform whose pod template
    sets the model, host and port itself, and what to say about what stays behind."""
    from vlmserve.export.k8s import engine_container_command

    if spec.engine != "vllm":
        raise UserError(
            f"{platform} runs vLLM images; engine: {spec.engine} (vlmserve's simulator) is not one: "
            "export it with `vlmserve export k8s`"
        )
    notes = check_platform_spec(spec, platform, drop_gateway_settings)
    bare = gateway_off(spec)
    _, args = engine_container_command(bare, model_in_pod, notes)
    args = cap_images(without_flags(args, POD_FLAGS), spec.max_images_per_request)
    return PlatformEngine(spec=bare, args=args, notes=notes, left_behind=left_behind(spec))


def comment_block(title: str, lines: list[str]) -> str:
    """The YAML comment at the top of a platform output: what it carries and what it does not."""
    body = "".join(f"#   - {line}\n" for line in lines)
    return f"# {title}\n# Not expressed on this platform (vlmserve's gateway did these):\n{body}"
