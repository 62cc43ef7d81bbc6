"""The search space of `vlmserve tune`: vLLM flags and the values to try, over a base deployment spec.

`--flag max-num-seqs=16,32,64` names a vLLM flag (dashes or underscores) and its values; several
`--flag`s span their cartesian product. Names are checked where the engine would check them:
vlmserve's own engine_args fields, else the installed vLLM's `serve` flags (vllm_flags.py), and
for the sim engine only the settings it models (a flag the sim ignores would make every
candidate the same). Each candidate is the base spec with its values laid into engine_args and
validated as a spec, so a value the spec refuses is one line naming the flag, before anything
starts. The base spec as given is the baseline and is always a candidate (measured first).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass

import yaml
from pydantic import ValidationError

from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject
from vlmserve.spec import DeploymentSpec, EngineArgs, describe_validation_error
from vlmserve.vllm_flags import check_engine_arg

MAX_SPACE_POINTS = 4096
"""Most candidates a space may hold: the planner ranks every one, and the store lists them."""

MAX_VALUES_PER_FLAG = 64

SIM_MODELLED_FLAGS = ("max_num_seqs", "max_num_batched_tokens", "api_server_count", "max_model_len")
"""vLLM flags whose meaning the sim engine models (engines.sim.launcher passes them on)."""

NOT_TUNABLE = ("served_model_name", "extra_args", "tensor_parallel_size")
"""engine_args fields that name or shape the deployment rather than tune it."""

Value = bool | int | float | str


@dataclass(frozen=True)
class FlagAxis:
    """One flag and the values tried for it."""

    name: str
    """The engine_args key (underscores), e.g. max_num_seqs."""
    values: tuple[Value, ...]

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Candidate:
    """One configuration: a value per flag (None: the base spec's own, i.e. the vLLM default)."""

    id: str
    params: dict[str, Value | None]
    baseline: bool = False

    @property
    def label(self) -> str:
        parts = [
            f"{name.replace('_', '-')}={'default' if value is None else _text(value)}" for name, value in self.params.items()
        ]
        return ("baseline: " if self.baseline else "") + " ".join(parts)


def _text(value: Value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _parse_value(raw: str, flag: str) -> Value:
    """'32' -> 32, 'true' -> True, '0.5' -> 0.5, 'fp8' -> 'fp8' (YAML scalars, as a spec would read them)."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    if value is None or isinstance(value, (list, dict)):
        raise UserError(f"--flag {flag}: '{raw}' is not a single value; separate values with commas")
    return value if isinstance(value, (bool, int, float, str)) else raw


def check_flag_name(raw_name: str, engine: str) -> str:
    """The engine_args key of `raw_name`, or one line saying why it cannot be tuned."""
    name = raw_name.strip().removeprefix("--").replace("-", "_")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise UserError(f"--flag '{raw_name}': not a flag name; write it like max-num-seqs=16,32")
    if name in NOT_TUNABLE:
        raise UserError(
            f"--flag {raw_name}: names or shapes the deployment; tune takes serving flags "
            "such as max-num-seqs or max-num-batched-tokens"
        )
    if engine == "sim":
        if name not in SIM_MODELLED_FLAGS:
            raise UserError(
                f"--flag {raw_name}: the sim engine does not model it (every candidate would be the same); "
                f"it models {', '.join(flag.replace('_', '-') for flag in SIM_MODELLED_FLAGS)}"
            )
        return name
    if name in EngineArgs.model_fields:
        return name
    problem = check_engine_arg(name)
    if problem is not None:
        raise UserError(f"--flag {raw_name}: {problem}")
    return name


def parse_flag(text: str, engine: str) -> FlagAxis:
    """'max-num-seqs=16,32,64' -> FlagAxis('max_num_seqs', (16, 32, 64))."""
    raw_name, sep, raw_values = text.partition("=")
    if not sep:
        raise UserError(f"--flag '{text}': write NAME=V1,V2,..., e.g. --flag max-num-seqs=16,32,64")
    name = check_flag_name(raw_name, engine)
    parts = [part.strip() for part in raw_values.split(",")]
    if not any(parts):
        raise UserError(f"--flag {raw_name.strip()}: give at least one value, e.g. {raw_name.strip()}=16,32")
    if "" in parts:
        raise UserError(f"--flag {raw_name.strip()}: an empty value in '{raw_values}'; separate values with single commas")
    if len(parts) > MAX_VALUES_PER_FLAG:
        raise UserError(f"--flag {raw_name.strip()}: {len(parts)} values; at most {MAX_VALUES_PER_FLAG} per flag")
    values = tuple(_parse_value(part, raw_name.strip()) for part in parts)
    seen: set[str] = set()
    for value in values:
        key = json.dumps(value)
        if key in seen:
            raise UserError(f"--flag {raw_name.strip()}: the value {_text(value)} is given twice")
        seen.add(key)
    return FlagAxis(name, values)


@dataclass(frozen=True)
class TuneSpace:
    """The base spec, the flags searched, and every candidate (the baseline first)."""

    base: DeploymentSpec
    axes: tuple[FlagAxis, ...]

    @classmethod
    def parse(cls, base: DeploymentSpec, flags: list[str]) -> "TuneSpace":
        if not flags:
            raise UserError("give at least one --flag NAME=V1,V2,..., e.g. --flag max-num-seqs=16,32,64")
        axes = tuple(parse_flag(text, base.engine) for text in flags)
        names = [axis.name for axis in axes]
        for name in names:
            if names.count(name) > 1:
                raise UserError(f"--flag {name.replace('_', '-')} is given twice; list all its values in one --flag")
        points = 1
        for axis in axes:
            points *= len(axis.values)
        if points > MAX_SPACE_POINTS:
            raise UserError(f"--flag: the space has {points} candidates; at most {MAX_SPACE_POINTS} (drop values or flags)")
        space = cls(base, axes)
        for candidate in space.candidates():
            space.spec_for(candidate)  # every value checked before anything starts
        return space

    def baseline_params(self) -> dict[str, Value | None]:
        """The base spec's own value of each flag (None where it leaves the engine's default)."""
        args = self.base.engine_args.model_dump()
        return {axis.name: args.get(axis.name) for axis in self.axes}

    def grid(self) -> list[Candidate]:
        """Every point of the cartesian product, in flag order, with stable ids."""
        combos = itertools.product(*(axis.values for axis in self.axes))
        baseline = self.baseline_params()
        points = []
        for combo in combos:
            params: dict[str, Value | None] = dict(zip((axis.name for axis in self.axes), combo))
            points.append(Candidate(_candidate_id(params), params, baseline=_same(params, baseline)))
        return points

    def candidates(self) -> list[Candidate]:
        """The baseline first (a grid point when the spec's values are on the grid), then the rest."""
        grid = self.grid()
        on_grid = [candidate for candidate in grid if candidate.baseline]
        baseline = on_grid[0] if on_grid else Candidate("baseline", self.baseline_params(), baseline=True)
        return [baseline, *(candidate for candidate in grid if not candidate.baseline)]

    def spec_for(self, candidate: Candidate) -> DeploymentSpec:
        """The base spec with the candidate's values in engine_args, validated as a spec."""
        data = self.base.model_dump(mode="json", exclude_unset=True)
        args = dict(data.get("engine_args") or {})
        for name, value in candidate.params.items():
            if value is not None:
                args[name] = value
        data["engine_args"] = args
        try:
            return DeploymentSpec.model_validate(data)
        except ValidationError as err:
            raise UserError(describe_validation_error(err, f"--flag candidate {candidate.label}")) from None

    def fingerprint_data(self) -> JSONObject:
        return {
            "base": self.base.model_dump(mode="json"),
            "axes": [{"name": axis.name, "values": list(axis.values)} for axis in self.axes],
        }


def _same(params: dict[str, Value | None], baseline: dict[str, Value | None]) -> bool:
    return all(json.dumps(params[name]) == json.dumps(baseline.get(name)) for name in params)


def _candidate_id(params: dict[str, Value | None]) -> str:
    """A short stable id from the values (stays the same when a resumed run lists them again)."""
    text = json.dumps(params, sort_keys=True)
    return "c" + hashlib.sha256(text.encode()).hexdigest()[:8]
