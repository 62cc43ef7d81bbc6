"""The tune's search space: flags checked where the engine checks them, candidates validated as specs."""

from __future__ import annotations

import pytest

from vlmserve.errors import UserError
from vlmserve.spec import DeploymentSpec
from vlmserve.tune.space import MAX_SPACE_POINTS, TuneSpace
from vlmserve.vllm_flags import installed_vllm_flags

VLLM_FLAGS = installed_vllm_flags()
"""Read at collection (importing vLLM starts a process, which the unit tier refuses inside a test)."""

SIM = DeploymentSpec(name="base", engine="sim", model="m", engine_args={"max_num_seqs": 64})


def test_cartesian_product_with_the_spec_as_baseline_first() -> None:
    base = SIM.model_copy(update={"engine_args": SIM.engine_args.model_copy(update={"max_num_batched_tokens": 2048})})
    space = TuneSpace.parse(base, ["max-num-seqs=16,64", "max_num_batched_tokens=1024,2048,4096"])
    candidates = space.candidates()
    assert len(candidates) == 6 and len({candidate.id for candidate in candidates}) == 6
    assert candidates[0].baseline and candidates[0].params == {"max_num_seqs": 64, "max_num_batched_tokens": 2048}
    assert not any(candidate.baseline for candidate in candidates[1:])
    spec = space.spec_for(candidates[1])
    assert spec.engine_args.max_num_seqs == candidates[1].params["max_num_seqs"]
    assert spec.name == "base" and spec.engine == "sim"


def test_baseline_off_the_grid_is_an_extra_candidate_with_vllm_defaults() -> None:
    space = TuneSpace.parse(SIM, ["max-num-seqs=8,16", "max-num-batched-tokens=512,1024"])
    candidates = space.candidates()
    assert len(candidates) == 5
    assert candidates[0].id == "baseline" and candidates[0].params == {"max_num_seqs": 64, "max_num_batched_tokens": None}
    assert "max-num-batched-tokens=default" in candidates[0].label
    assert space.spec_for(candidates[0]).engine_args.max_num_batched_tokens is None


def test_baseline_on_the_grid_is_that_grid_point() -> None:
    space = TuneSpace.parse(SIM, ["max-num-seqs=16,64"])
    candidates = space.candidates()
    assert len(candidates) == 2 and candidates[0].baseline and candidates[0].params == {"max_num_seqs": 64}


def test_values_read_as_yaml_scalars_for_a_vllm_spec() -> None:
    base = DeploymentSpec(name="v", engine="vllm", model="embedded")
    space = TuneSpace.parse(base, ["enable-prefix-caching=true,false", "max-num-seqs=4,8"])
    values = {axis.name: axis.values for axis in space.axes}
    assert values == {"enable_prefix_caching": (True, False), "max_num_seqs": (4, 8)}


def test_ids_are_stable_across_parses() -> None:
    first = [candidate.id for candidate in TuneSpace.parse(SIM, ["max-num-seqs=16,32"]).candidates()]
    second = [candidate.id for candidate in TuneSpace.parse(SIM, ["max-num-seqs=16,32"]).candidates()]
    assert first == second


@pytest.mark.skipif(VLLM_FLAGS is None, reason="vLLM is not installed")
@pytest.mark.hostile("tune --flag: a misspelt vLLM flag is one line with the installed vLLM's suggestion")
def test_misspelt_vllm_flag_is_refused_with_a_suggestion() -> None:
    base = DeploymentSpec(name="v", engine="vllm", model="embedded")
    with pytest.raises(UserError, match=r"^--flag max-num-seq: not a flag of the installed vLLM; did you mean 'max_num_seqs'\?$"):
        TuneSpace.parse(base, ["max-num-seq=4,8"])


@pytest.mark.parametrize(
    "flags, message",
    [
        ([], "give at least one --flag NAME=V1,V2,..., e.g. --flag max-num-seqs=16,32,64"),
        (["max-num-seqs"], "--flag 'max-num-seqs': write NAME=V1,V2,..., e.g. --flag max-num-seqs=16,32,64"),
        (["max-num-seqs="], "--flag max-num-seqs: give at least one value, e.g. max-num-seqs=16,32"),
        (["max-num-seqs=4,,8"], "--flag max-num-seqs: an empty value in '4,,8'; separate values with single commas"),
        (["max-num-seqs=4,4"], "--flag max-num-seqs: the value 4 is given twice"),
        (["max-num-seqs=4", "max_num_seqs=8"], "--flag max-num-seqs is given twice; list all its values in one --flag"),
        (["Max Seqs=4"], "--flag 'Max Seqs': not a flag name; write it like max-num-seqs=16,32"),
        (
            ["enable-prefix-caching=true"],
            "--flag enable-prefix-caching: the sim engine does not model it (every candidate "
            "would be the same); it models max-num-seqs, max-num-batched-tokens, "
            "api-server-count, max-model-len",
        ),
        (
            ["served-model-name=a,b"],
            "--flag served-model-name: names or shapes the deployment; tune takes serving flags "
            "such as max-num-seqs or max-num-batched-tokens",
        ),
        (
            ["max-num-seqs=[1,2]"],
            "--flag candidate max-num-seqs=[1: field 'engine_args.max_num_seqs': "
            "Input should be a valid integer, unable to parse string as an integer",
        ),
    ],
)
@pytest.mark.hostile("tune --flag: a missing '=', empty or repeated values, a repeated flag, a flag the sim ignores")
def test_bad_flags_are_one_line(flags: list[str], message: str) -> None:
    with pytest.raises(UserError) as raised:
        TuneSpace.parse(SIM, flags)
    assert raised.value.message == message


@pytest.mark.hostile("tune --flag: a value the spec refuses (max-num-seqs=0) is one line naming the flag, before any start")
def test_a_value_the_spec_refuses_names_the_candidate() -> None:
    with pytest.raises(UserError) as raised:
        TuneSpace.parse(SIM, ["max-num-seqs=0,16"])
    assert raised.value.message.startswith(
        "--flag candidate baseline: max-num-seqs=0: field 'engine_args.max_num_seqs'"
    ) or raised.value.message.startswith("--flag candidate max-num-seqs=0: field 'engine_args.max_num_seqs'")
    assert "greater than or equal to 1" in raised.value.message


@pytest.mark.hostile("tune --flag: a space over the candidate limit is refused before it is built")
def test_a_space_too_large_is_refused() -> None:
    values = ",".join(str(value) for value in range(1, 65))
    with pytest.raises(UserError, match=f"the space has {64 * 64 * 64} candidates; at most {MAX_SPACE_POINTS}"):
        TuneSpace.parse(
            SIM,
            [
                f"max-num-seqs={values}",
                f"max-num-batched-tokens={values}",
                f"max-model-len={','.join(str(16 + value) for value in range(64))}",
            ],
        )
