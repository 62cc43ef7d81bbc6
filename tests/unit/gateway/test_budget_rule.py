"""The token-budget rule in this process: the shared case table, what a request is charged and
settled to, absurd output limits, and tenant limits that are checked when the keys file loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.budget_cases import BUDGET_CASES, LEVEL_TOLERANCE, RATE_PER_S, Admit, BudgetCase
from vlmserve.errors import UserError
from vlmserve.gateway.admission import (
    MAX_OUTPUT_TOKENS,
    Admission,
    AdmissionRejected,
    Charge,
    Tenant,
    TokenBucket,
    admissible_tokens,
    check_output_limits,
    context_tokens,
    load_keys_file,
    settled_tokens,
)
from vlmserve.gateway.request_info import choices_of


@pytest.mark.parametrize("case", BUDGET_CASES, ids=[case.name for case in BUDGET_CASES])
async def test_the_in_process_bucket_follows_the_shared_table(case: BudgetCase) -> None:
    admission = Admission(None)
    tenant = Tenant("t", token_bucket=TokenBucket(RATE_PER_S, case.capacity))
    assert tenant.token_bucket is not None
    for number, step in enumerate(case.steps):
        if isinstance(step, Admit):
            try:
                charge = await admission.check_rate(tenant, step.cost)
            except AdmissionRejected as rejected:
                assert rejected.status == 429 and rejected.retry_after_s and rejected.retry_after_s > 0
                charge = None
            assert (charge is not None) == step.admitted, (number, step)
            if charge is not None:
                assert charge == Charge("local", step.cost)  # the whole cost, not the capacity
        else:
            admission.settle_tokens(tenant, Charge("local", step.charged), step.used)
        assert tenant.token_bucket.tokens == pytest.approx(step.level, abs=LEVEL_TOLERANCE), (number, step)


def test_the_admissible_cost_is_the_prompt_and_the_output_limit_capped_by_the_context() -> None:
    assert admissible_tokens(16, 8000, 1, None) == 8016
    assert admissible_tokens(16, 8000, 1, 4096) == 16 + 4096
    assert admissible_tokens(16, 3 * 8000, 3, 4096) == 16 + 3 * 4096
    assert admissible_tokens(16, 100, 1, 4096) == 116
    assert context_tokens({"id": "m", "max_model_len": 4096}) == 4096
    assert context_tokens({"id": "m", "max_model_len": "4096"}) is None
    assert context_tokens({"id": "m", "max_model_len": True}) is None
    assert context_tokens(None) is None
    assert choices_of({"n": 3}) == 3 and choices_of({}) == 1


def test_a_finished_request_is_settled_to_its_use_or_the_gateways_own_count() -> None:
    assert settled_tokens("200", 30, 200, 25) == 230  # the engine's usage
    # a stream without include_usage: no prompt count from the engine, so the gateway's estimate
    # (the relayed chunks stand for the completion), never 0
    assert settled_tokens("200", None, 20, 2115) == 2135
    assert settled_tokens("502", None, None, 2115) == 2115  # an error answer cost its prompt at most
    assert settled_tokens("abandoned", None, None, 2115) is None  # unknown: the whole charge stays
    assert settled_tokens("200", None, None, 2115) is None
    assert settled_tokens("200", "30", 1.5, 25) is None  # numbers an engine wrote wrong are not trusted
    assert settled_tokens("200", -5, 10, 25) == 35


@pytest.mark.hostile("max_tokens of 1e309, 10**309, negative, zero, fractional, a string or a boolean")
@pytest.mark.parametrize(
    "value",
    [float("inf"), 10**309, -1, 0, 12.5, "100", True, float("nan"), MAX_OUTPUT_TOKENS + 1],
    ids=["inf", "10**309", "negative", "zero", "fraction", "string", "bool", "nan", "over-int32"],
)
@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens", "max_output_tokens", "n"])
def test_an_absurd_output_limit_is_a_400_naming_the_field(key: str, value: object) -> None:
    with pytest.raises(AdmissionRejected) as refused:
        check_output_limits({key: value})
    assert refused.value.status == 400 and refused.value.code in ("invalid_max_tokens", "invalid_n")
    assert refused.value.message.startswith(f"'{key}' must be a whole number from 1 to {MAX_OUTPUT_TOKENS}")
    assert len(refused.value.message) < 120 and "\n" not in refused.value.message


def test_sane_output_limits_pass() -> None:
    check_output_limits({"max_tokens": 8000, "n": 2, "max_completion_tokens": None})
    check_output_limits({"max_tokens": MAX_OUTPUT_TOKENS})
    check_output_limits({})


@pytest.mark.hostile("a tenant limit of inf, 1e-30, nan, 0 or negative in the keys file")
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tokens_per_min", ".inf"),
        ("tokens_per_min", "1e-30"),
        ("tokens_per_min", ".nan"),
        ("tokens_per_min", "0"),
        ("requests_per_s", ".inf"),
        ("requests_per_s", "1e-30"),
        ("requests_per_s", "-2"),
        ("burst_requests", "1e300"),
        ("burst_requests", "0.5"),
    ],
)
def test_a_tenant_limit_out_of_bounds_is_one_line_naming_the_tenant_and_key(tmp_path: Path, key: str, value: str) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        f"tenants:\n  - name: ok\n    keys: [sk-ok]\n    tokens_per_min: 1000\n"
        f"  - name: greedy\n    keys: [sk-greedy]\n    requests_per_s: 5\n    {key}: {value}\n"
    )
    with pytest.raises(UserError) as bad:
        load_keys_file(keys)
    message = str(bad.value)
    assert "\n" not in message and str(keys) in message
    assert "tenant 'greedy'" in message and key in message and "must be a finite number from" in message, message


def test_limits_within_bounds_load(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        "tenants:\n  - name: t\n    keys: [k]\n    requests_per_s: 0.5\n    burst_requests: 2\n    tokens_per_min: 1e9\n"
    )
    (tenant,) = load_keys_file(keys)
    assert tenant.tokens_per_min == 1e9 and tenant.requests_per_s == 0.5
