"""The sweep spec: deployments × load cells × SLOs, loaded from one YAML file.

A sweep is the study a team runs before calling a model a service: every deployment
(a DeploymentSpec vlmserve starts itself, or an endpoint someone else runs) is driven
through the same list of load cells. Cells can be written one by one or as a matrix
(`vary:` lists are expanded as a cartesian product over a shared `base:`).
Every mistake is reported as one line naming the field.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vlmserve.errors import UserError
from vlmserve.spec import SLO, DeploymentSpec, LoadSpec, describe_validation_error, load_yaml_file, parse_duration_s

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _simple_name(value: str) -> str:
    """Names become directory and label parts, so keep them plain."""
    if not _NAME.match(value):
        raise ValueError("use letters, digits, '-', '_' or '.' only")
    return value


SimpleName = Annotated[str, AfterValidator(_simple_name)]


class DeploymentEntry(BaseModel):
    """One deployment of the sweep: started by vlmserve (`spec`) or already running (`endpoint`)."""

    model_config = ConfigDict(extra="forbid")

    name: SimpleName
    spec: DeploymentSpec | None = None
    """A deployment vlmserve starts fresh, verifies, warms up and tears down."""
    spec_file: str | None = None
    """Path (relative to the sweep file) of a deployment spec YAML, instead of `spec`."""
    endpoint: str | None = None
    """Base URL of an OpenAI-compatible server someone else runs (e.g. http://127.0.0.1:8000)."""
    model: str | None = None
    """Model name to request from `endpoint`; for `spec` deployments the served name is used."""
    gpus: float | None = Field(None, gt=0)
    """Devices this deployment uses, for per-GPU figures; default replicas × tensor_parallel_size."""
    usd_per_gpu_hour: float | None = Field(None, ge=0)
    """Price of one device-hour; enables cost per million tokens."""

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"'{value}' is not a URL; write it like http://127.0.0.1:8000")
        return value.rstrip("/") if value else value

    @model_validator(mode="after")
    def _name_the_deployment(self) -> "DeploymentEntry":
        """A spec without its own name runs under the entry's name (the supervisor keys its state by it)."""
        if self.spec is not None and "name" not in self.spec.model_fields_set:
            self.spec = self.spec.model_copy(update={"name": self.name})
            self.spec.model_fields_set.add("name")
        return self

    @model_validator(mode="after")
    def _exactly_one_source(self) -> "DeploymentEntry":
        given = [key for key in ("spec", "spec_file") if getattr(self, key) is not None]
        if len(given) > 1 or (not given and self.endpoint is None):
            raise ValueError("give exactly one of spec, spec_file or endpoint")
        if self.endpoint is not None and not (self.model or self.spec):
            raise ValueError("an endpoint deployment needs model: (the name to request)")
        return self

    @property
    def managed(self) -> bool:
        """True when vlmserve starts and stops this deployment itself.

        An `endpoint` with a `spec` describes a deployment already running (e.g. the demo's):
        the sweep uses it as it is and the report still shows its spec.
        """
        return self.endpoint is None

    def device_count(self) -> float:
        """Devices used, for per-GPU normalisation (a CPU replica counts as one device)."""
        if self.gpus is not None:
            return self.gpus
        if self.spec is not None:
            return float(self.spec.replicas * self.spec.engine_args.tensor_parallel_size)
        return 1.0

    def served_model(self) -> str:
        """The model name clients must send."""
        if self.model:
            return self.model
        if self.spec is not None:
            from vlmserve.engines.vllm import served_model_name

            return served_model_name(self.spec)
        return self.model or ""


class CellEntry(BaseModel):
    """One load cell: a name and a LoadSpec (written inline, flat)."""

    model_config = ConfigDict(extra="forbid")

    name: SimpleName
    load: LoadSpec


class KneeSettings(BaseModel):
    """When more load stops paying: throughput grows by less than `min_gain_fraction` of the load's growth.

    Growth is compared in log terms (see vlmserve.sweep.knee), so uneven load steps are judged alike.
    """

    model_config = ConfigDict(extra="forbid")

    min_gain_fraction: float = Field(0.5, gt=0, le=1)


class SweepSpec(BaseModel):
    """A whole study: every deployment × every cell, judged against the SLOs."""

    model_config = ConfigDict(extra="forbid")

    name: SimpleName
    description: str | None = None
    deployments: list[DeploymentEntry] = Field(min_length=1)
    cells: list[CellEntry] = Field(min_length=1)
    slo: SLO = Field(default_factory=SLO)
    knee: KneeSettings = Field(default_factory=KneeSettings)
    warmup_requests: int = Field(4, ge=0)
    """Requests sent (and discarded) after a deployment is ready, before its first cell."""

    @model_validator(mode="after")
    def _unique_names(self) -> "SweepSpec":
        for kind, names in (
            ("deployments", [entry.name for entry in self.deployments]),
            ("cells", [cell.name for cell in self.cells]),
        ):
            seen: set[str] = set()
            for name in names:
                if name in seen:
                    raise ValueError(f"{kind}: name '{name}' is used twice; names must be unique")
                seen.add(name)
        return self

    def cell_keys(self) -> list[tuple[str, str]]:
        """(deployment, cell) pairs in the order they run."""
        return [(entry.name, cell.name) for entry in self.deployments for cell in self.cells]

    def deployment(self, name: str) -> DeploymentEntry:
        for entry in self.deployments:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def cell(self, name: str) -> CellEntry:
        for cell in self.cells:
            if cell.name == name:
                return cell
        raise KeyError(name)

    def fingerprint(self) -> str:
        """Short hash of what the sweep measures, to refuse resuming a different study."""
        text = json.dumps(self.model_dump(mode="json", exclude={"description"}), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _expand_cells(raw_cells: object) -> object:
    """Turn `{base: {...}, vary: {k: [..]}, name: "in{input_len}-c{concurrency}"}` items into cells.

    Plain cells (`name:` + LoadSpec fields) pass through; a `load:` key is accepted too.
    """
    if not isinstance(raw_cells, list):
        return raw_cells
    expanded: list[object] = []
    for index, item in enumerate(raw_cells):
        if not isinstance(item, dict):
            expanded.append(item)
            continue
        if "vary" in item or "base" in item:
            unknown = set(item) - {"base", "vary", "name"}
            if unknown:
                raise UserError(
                    f"field 'cells.{index}.{sorted(unknown)[0]}': unknown field in a matrix cell; use base:, vary: and name:"
                )
            base = dict(item.get("base") or {})
            vary = item.get("vary") or {}
            if not isinstance(vary, dict) or not all(isinstance(v, list) and v for v in vary.values()):
                raise UserError(f"field 'cells.{index}.vary': give each varied field a non-empty list")
            template = item.get("name") or "-".join(f"{key}{{{key}}}" for key in vary)
            for combo in itertools.product(*vary.values()):
                values = dict(zip(vary.keys(), combo))
                try:
                    name = str(template).format(**values)
                except (KeyError, IndexError) as err:
                    raise UserError(f"field 'cells.{index}.name': template names {err}, which is not varied") from None
                expanded.append({"name": name, **base, **values})
        else:
            expanded.append(item)
    cells: list[object] = []
    for item in expanded:
        if isinstance(item, dict) and "load" not in item:
            load = {key: value for key, value in item.items() if key != "name"}
            cells.append({"name": item.get("name"), "load": load})
        else:
            cells.append(item)
    return cells


def _normalise_slo(raw: object) -> object:
    """Accept `slo: "ttft_p95=500ms,..."` or `slo: {ttft_p95: 500ms}` besides `{bounds_s: ...}`."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        return SLO.parse(raw).model_dump()
    if isinstance(raw, dict) and "bounds_s" not in raw:
        bounds: dict[str, object] = {}
        for key, value in raw.items():
            if isinstance(value, str):
                try:
                    value = parse_duration_s(value)
                except ValueError as err:
                    raise UserError(f"field 'slo.{key}': {err}") from None
            bounds[key] = value
        return {"bounds_s": bounds}
    return raw


def _resolve_paths(data: dict[str, object], base_dir: Path) -> None:
    """Make dataset paths and spec files relative to the sweep file, so examples run from anywhere."""
    cells = data.get("cells")
    for cell in cells if isinstance(cells, list) else []:
        load = cell.get("load") if isinstance(cell, dict) else None
        if isinstance(load, dict) and isinstance(load.get("dataset_path"), str):
            path = Path(load["dataset_path"]).expanduser()
            if not path.is_absolute():
                load["dataset_path"] = str((base_dir / path).resolve())
    deployments = data.get("deployments")
    for entry in deployments if isinstance(deployments, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("spec_file"), str):
            path = Path(entry["spec_file"]).expanduser()
            if not path.is_absolute():
                path = (base_dir / path).resolve()
            from vlmserve.spec import load_deployment_spec

            entry["spec"] = load_deployment_spec(path).model_dump()
            entry["spec_file"] = None
            del entry["spec_file"]


def parse_sweep_spec(data: object, source: str, base_dir: Path | None = None) -> SweepSpec:
    """Validate a sweep spec from parsed YAML; any problem becomes one line naming the field."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: a sweep spec is a YAML mapping with name:, deployments: and cells:")
    data = dict(data)
    data["cells"] = _expand_cells(data.get("cells"))
    try:
        data["slo"] = _normalise_slo(data.get("slo"))
    except UserError as err:
        raise UserError(f"{source}: {err.message}") from None
    _resolve_paths(data, base_dir or Path.cwd())
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise UserError(describe_validation_error(err, source)) from None
    for cell in spec.cells:
        if cell.load.dataset_path and not Path(cell.load.dataset_path).is_file():
            raise UserError(
                f"{source}: field 'cells.{cell.name}.dataset_path': {cell.load.dataset_path} "
                "does not exist; check the path (relative paths are relative to the sweep file)"
            )
    return spec


def load_sweep_spec(path: str | Path) -> SweepSpec:
    """Load a sweep YAML file (see examples/sweep-*.yaml)."""
    file_path = Path(path)
    data = load_yaml_file(file_path)
    try:
        return parse_sweep_spec(data, str(file_path), base_dir=file_path.resolve().parent)
    except UserError as err:
        if err.message.startswith(str(file_path)):
            raise
        raise UserError(f"{file_path}: {err.message}") from None
