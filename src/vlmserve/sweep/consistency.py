"""`vlmserve consistency --deployment SPEC`: start the deployment itself, once per variant, and check each.

The variants are prefix caching on and off (vLLM's `enable_prefix_caching`, set in the spec's
engine_args so it wins over a recipe). With more than one replica behind the gateway, a request
alone and its copy under load may be answered by different replicas, so the check also compares
answers across replicas. Each variant is started fresh (as a sweep starts its deployments) and
torn down before the next; the check itself is `vlmserve.bench.consistency`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from vlmserve.bench.consistency.compare import ConsistencyReport
from vlmserve.bench.consistency.runner import ConsistencyOptions, run_check
from vlmserve.bench.target import Target
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject
from vlmserve.spec import DeploymentSpec, load_deployment_spec

PREFIX_CACHING_CHOICES = {"both": (True, False), "on": (True,), "off": (False,)}


def variant_spec(spec: DeploymentSpec, prefix_caching: bool) -> DeploymentSpec:
    """The spec with prefix caching set explicitly (a user's engine_args win over the recipe's)."""
    engine_args = spec.engine_args.model_copy(update={"enable_prefix_caching": prefix_caching})
    return spec.model_copy(update={"engine_args": engine_args})


def variant_name(spec: DeploymentSpec, prefix_caching: bool) -> str:
    replicas = (
        f"{spec.replicas} replicas behind the gateway" if spec.replicas > 1 and spec.gateway else f"{spec.replicas} replica(s)"
    )
    return f"prefix caching {'on' if prefix_caching else 'off'}, {replicas}"


def check_deployment(
    spec_file: Path,
    options: ConsistencyOptions,
    prefix_caching: str,
    model: str | None = None,
    api_key: str | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> list[ConsistencyReport]:
    """Start each variant of the spec, check it, tear it down; one report per variant."""
    from vlmserve.sweep.hygiene import verify_serving, with_free_ports
    from vlmserve.sweep.runner import deployment_endpoint
    from vlmserve.sweep.spec import DeploymentEntry

    if prefix_caching not in PREFIX_CACHING_CHOICES:
        raise UserError(f"--prefix-caching '{prefix_caching}': use one of {', '.join(PREFIX_CACHING_CHOICES)}")
    options.validate()  # before any deployment is started for nothing
    base = load_deployment_spec(spec_file)
    reports: list[ConsistencyReport] = []
    for enabled in PREFIX_CACHING_CHOICES[prefix_caching]:
        spec = with_free_ports(variant_spec(base, enabled))
        entry = DeploymentEntry(name=spec.name, spec=spec, model=model)
        name = variant_name(spec, enabled)
        progress(f"starting deployment {spec.name} ({name})")
        with deployment_endpoint(entry) as ready:
            verify_serving(ready.base_url, entry.served_model(), spec.engine_args.max_model_len)
            report = run_check(Target(ready.base_url, entry.served_model(), api_key), options, progress)
        report.variant = name
        reports.append(report)
    return reports


def combined_result(reports: list[ConsistencyReport]) -> JSONObject:
    """The JSON result of a deployment check: every variant's report, and whether all passed."""
    return {
        "kind": "consistency",
        "passed": all(report.passed for report in reports),
        "variants": [report.to_dict() for report in reports],
    }
