"""The flags of `vlmserve up`, declared once from DeploymentSpec and EngineArgs (cli.model_options).

Each flag sets the spec field of its name, laid over the spec file: a flag not given (None) leaves
the file's value, or the field's default. `--file`, `--engine-arg`, `--benchmark-recipe`,
`--print-plan` and `--autoscale` are the command's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import typer

from vlmserve.cli.model_options import Flag, OptionGroup, field_default, model_option
from vlmserve.cli.options import parse_json_object_flag
from vlmserve.spec import DeploymentSpec, EngineArgs


def _json_flag(flag: str) -> Callable[[str], dict[str, Any] | None]:
    return lambda text: parse_json_object_flag(flag, text)


def _domains(values: list[str]) -> list[str] | None:
    """Repeated or comma-separated hosts; none given: the spec's own."""
    return [domain.strip() for value in values for domain in value.split(",") if domain.strip()] or None


def _same(value: Any) -> Any:
    """--recipe/--no-recipe sets the field's bool (--benchmark-recipe its third value)."""
    return value


UP = OptionGroup(
    "flags",
    {
        "file": Flag(
            typer.Option(None, "-f", "--file", help="Deployment spec (YAML). Flags override its values."), Optional[Path]
        ),
        "model": model_option(
            DeploymentSpec, "model", help="Model: 'embedded' (default), a local directory, or a hub id.", given_only=True
        ),
        "name": model_option(
            DeploymentSpec,
            "name",
            help=f"Deployment name (state and logs go under it). Default: {field_default(DeploymentSpec, 'name')}.",
            given_only=True,
        ),
        "replicas": model_option(DeploymentSpec, "replicas", help="Number of engine replicas.", given_only=True),
        "port": model_option(DeploymentSpec, "port", help="Gateway port; replicas take the ports after it.", given_only=True),
        "host": model_option(
            DeploymentSpec,
            "host",
            help=f"Address to listen on (default {field_default(DeploymentSpec, 'host')}).",
            given_only=True,
        ),
        "engine": model_option(DeploymentSpec, "engine", help="vllm (real engine) or sim (simulated engine).", given_only=True),
        "devices": model_option(
            DeploymentSpec, "devices", help="auto, cpu or gpu (auto: GPU when nvidia-smi sees one).", given_only=True
        ),
        "gateway": model_option(DeploymentSpec, "gateway", help="Start the gateway in front.", pair=True, given_only=True),
        "gateway_policy": model_option(DeploymentSpec, "gateway_policy", help="Gateway routing policy.", given_only=True),
        "gateway_workers": model_option(
            DeploymentSpec, "gateway_workers", help="Gateway processes sharing its port (1-64).", given_only=True
        ),
        "kv_cache_space_gb": model_option(
            DeploymentSpec, "kv_cache_space_gb", help="CPU engines: KV cache per replica in GB.", given_only=True
        ),
        "cpu_threads_per_replica": model_option(
            DeploymentSpec, "cpu_threads_per_replica", help="CPU engines: cores bound to each replica.", given_only=True
        ),
        "dtype": model_option(EngineArgs, "dtype", help="Engine dtype (auto, bfloat16, float16, ...).", given_only=True),
        "tensor_parallel_size": model_option(
            EngineArgs, "tensor_parallel_size", "-tp", help="GPUs per replica.", given_only=True
        ),
        "max_model_len": model_option(EngineArgs, "max_model_len", help="Context length the engine serves.", given_only=True),
        "gpu_memory_utilization": model_option(
            EngineArgs, "gpu_memory_utilization", help="GPU engines: fraction of GPU memory to use.", given_only=True
        ),
        "max_num_seqs": model_option(EngineArgs, "max_num_seqs", help="Engine: most sequences in a batch.", given_only=True),
        "max_num_batched_tokens": model_option(
            EngineArgs, "max_num_batched_tokens", help="Engine: token budget per step.", given_only=True
        ),
        "kv_cache_dtype": model_option(
            EngineArgs, "kv_cache_dtype", help="Engine: KV cache dtype (auto, fp8, ...).", given_only=True
        ),
        "enable_prefix_caching": model_option(
            EngineArgs, "enable_prefix_caching", help="Engine: prefix caching.", pair=True, given_only=True
        ),
        "limit_mm_per_prompt": model_option(
            EngineArgs,
            "limit_mm_per_prompt",
            help="Engine: JSON, e.g. '{\"image\": 2}'.",
            given_only=True,
            annotation=str,
            parse=_json_flag("--limit-mm-per-prompt"),
        ),
        "mm_processor_kwargs": model_option(
            EngineArgs,
            "mm_processor_kwargs",
            help="Engine: JSON kwargs for the multimodal processor.",
            given_only=True,
            annotation=str,
            parse=_json_flag("--mm-processor-kwargs"),
        ),
        "async_scheduling": model_option(
            EngineArgs, "async_scheduling", help="Engine: overlap scheduling with execution.", pair=True, given_only=True
        ),
        "enforce_eager": model_option(
            EngineArgs,
            "enforce_eager",
            help="Engine: skip torch.compile (default: only for 'embedded').",
            pair=True,
            given_only=True,
        ),
        "served_model_name": model_option(EngineArgs, "served_model_name", help="The model name clients send.", given_only=True),
        "engine_arg": Flag(
            typer.Option(None, "--engine-arg", help="Extra engine flag(s), passed as given, e.g. --engine-arg=--enforce-eager."),
            Optional[list[str]],
        ),
        "ready_timeout_s": model_option(
            DeploymentSpec, "ready_timeout_s", help="Seconds each process may take to become ready.", given_only=True
        ),
        "keys_file": model_option(
            DeploymentSpec,
            "keys_file",
            help="Gateway: YAML file of tenants and API keys (clients must send one).",
            given_only=True,
            annotation=Path,
            parse=str,
        ),
        "audit_log": model_option(
            DeploymentSpec,
            "audit_log",
            help="Gateway: append one JSON line per request to this file.",
            given_only=True,
            annotation=Path,
            parse=str,
        ),
        "ssl_certfile": model_option(
            DeploymentSpec,
            "ssl_certfile",
            help="Gateway: TLS certificate (PEM); needs --ssl-keyfile.",
            given_only=True,
            annotation=Path,
            parse=str,
        ),
        "ssl_keyfile": model_option(
            DeploymentSpec, "ssl_keyfile", help="Gateway: TLS private key (PEM).", given_only=True, annotation=Path, parse=str
        ),
        "allowed_media_domains": model_option(
            DeploymentSpec,
            "allowed_media_domains",
            help="Host media URLs may point at, as vLLM's flag (repeat or comma-separate); default: none, images inline only.",
            given_only=True,
            parse=_domains,
        ),
        "open_": model_option(
            DeploymentSpec, "open", help="Serve a non-loopback --host without --keys-file, on purpose.", given_only=True
        ),
        "recipe": model_option(
            DeploymentSpec,
            "recipe",
            help="Lay the model family's vLLM flags (parsers, multimodal limits) under yours; default on (docs/recipes.md).",
            pair=True,
            given_only=True,
            annotation=bool,
            parse=_same,
        ),
        "benchmark_recipe": Flag(
            typer.Option(False, "--benchmark-recipe", help="The recipe's benchmark variant: also prefix caching off."), bool
        ),
        "print_plan": Flag(
            typer.Option(False, "--print-plan", help="Print each replica's command and environment; start nothing."), bool
        ),
        "autoscale": Flag(
            typer.Option(
                None,
                "--autoscale",
                metavar="MIN:MAX",
                help="Add and remove replicas on the engines' queue, between MIN and MAX (the rule `export k8s` gives KEDA; "
                "other settings from the spec's autoscale: section; docs/autoscaling.md).",
            ),
            Optional[str],
            differs="MIN:MAX laid over the spec's autoscale: section, not the whole rule",
        ),
    },
)
"""Every `vlmserve up` flag, in its --help order."""
