"""API keys, token buckets, the priority queue and keys-file errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from vlmserve.errors import UserError
from vlmserve.gateway.admission import Admission, AdmissionRejected, Charge, TenantSpec, TokenBucket, load_keys_file


def tenants() -> list[TenantSpec]:
    return [
        TenantSpec(name="clinic", keys=["sk-clinic"], requests_per_s=2, tokens_per_min=6000),
        TenantSpec(name="batchjobs", keys=["sk-batch"], priority="batch"),
    ]


def test_open_gateway_admits_everyone_as_anonymous() -> None:
    admission = Admission(None)
    assert admission.authenticate(None, None).name == "anonymous"


def test_keys_map_to_tenants_and_bad_keys_are_401() -> None:
    admission = Admission(tenants())
    assert admission.authenticate("Bearer sk-clinic", None).name == "clinic"
    assert admission.authenticate(None, "sk-batch").name == "batchjobs"
    with pytest.raises(AdmissionRejected) as missing:
        admission.authenticate(None, None)
    assert missing.value.status == 401 and "missing API key" in missing.value.message
    with pytest.raises(AdmissionRejected) as wrong:
        admission.authenticate("Bearer sk-nope", None)
    assert wrong.value.status == 401 and "invalid API key" in wrong.value.message


async def test_request_rate_limit_gives_429_with_retry_after() -> None:
    admission = Admission(tenants())
    clinic = admission.tenants["clinic"]
    assert await admission.check_rate(clinic, 10) == Charge("local", 10)
    await admission.check_rate(clinic, 10)  # bucket of 2 (one second's worth)
    with pytest.raises(AdmissionRejected) as limited:
        await admission.check_rate(clinic, 10)
    assert limited.value.status == 429 and 0 < limited.value.retry_after_s <= 1.0


async def test_token_rate_limit_counts_estimated_tokens_and_settles() -> None:
    admission = Admission([TenantSpec(name="t", keys=["k"], tokens_per_min=1000)])
    tenant = admission.tenants["t"]
    charge = await admission.check_rate(tenant, 900)
    with pytest.raises(AdmissionRejected):
        await admission.check_rate(tenant, 900)
    admission.settle_tokens(tenant, charge, 100)  # it used far less than it was charged: refund
    await admission.check_rate(tenant, 700)


async def test_a_tenant_without_limits_is_charged_nowhere() -> None:
    admission = Admission(tenants())
    assert await admission.check_rate(admission.tenants["batchjobs"], 10_000) is None


def test_token_bucket_refills_over_time() -> None:
    bucket = TokenBucket(rate_per_s=10, capacity=10)
    bucket.take(10)
    assert bucket.wait_s(5, bucket.updated_at) == pytest.approx(0.5)
    assert bucket.wait_s(5, bucket.updated_at + 0.5) == 0.0


def test_priority_header_may_lower_but_not_raise() -> None:
    admission = Admission(tenants())
    clinic, batch = admission.tenants["clinic"], admission.tenants["batchjobs"]
    assert admission.priority_for(clinic, None) == "interactive"
    assert admission.priority_for(clinic, "batch") == "batch"
    assert admission.priority_for(batch, "interactive") == "batch"
    with pytest.raises(AdmissionRejected) as bad:
        admission.priority_for(clinic, "urgent")
    assert bad.value.status == 400


async def test_queue_serves_interactive_before_batch_and_sheds_when_full() -> None:
    admission = Admission(None, max_in_flight=1, queue_limits={"interactive": 2, "batch": 1}, queue_timeout_s=5)
    await admission.acquire_slot("interactive")  # takes the only slot
    order: list[str] = []

    async def wait(name: str, priority: str) -> None:
        await admission.acquire_slot(priority)
        order.append(name)

    batch = asyncio.create_task(wait("batch", "batch"))
    await asyncio.sleep(0)
    inter = asyncio.create_task(wait("interactive", "interactive"))
    await asyncio.sleep(0)
    with pytest.raises(AdmissionRejected) as full:
        await admission.acquire_slot("batch")
    assert full.value.status == 429 and full.value.reason == "queue_full"
    admission.release_slot()
    await asyncio.sleep(0.01)
    admission.release_slot()
    await asyncio.gather(batch, inter)
    assert order == ["interactive", "batch"]
    admission.release_slot()
    assert admission.in_flight == 0


async def test_queue_timeout_is_429_and_cancelled_waiters_free_their_place() -> None:
    admission = Admission(None, max_in_flight=1, queue_limits={"interactive": 1, "batch": 1}, queue_timeout_s=0.05)
    await admission.acquire_slot("interactive")
    with pytest.raises(AdmissionRejected) as timed_out:
        await admission.acquire_slot("interactive")
    assert timed_out.value.reason == "queue_timeout"
    waiter = asyncio.create_task(admission.acquire_slot("interactive"))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert admission.queued("interactive") == 0
    admission.release_slot()
    assert admission.in_flight == 0


def test_keys_file_errors_are_one_line(tmp_path: Path) -> None:
    good = tmp_path / "keys.yaml"
    good.write_text("tenants:\n  - name: a\n    keys: [k1]\n    requests_per_s: 5\n")
    assert load_keys_file(good)[0].name == "a"
    cases = {
        "tenants:\n  - name: a\n    keys: [k1]\n    requests_per_sec: 5\n": "unknown field",
        "tenants:\n  - name: a\n    keys: [k1]\n  - name: b\n    keys: [k1]\n": "listed for both",
        "tenants: [\n": "not valid YAML",
        "- a\n": "YAML mapping",
        "tenants:\n  - name: a\n    keys: []\n": "keys",
    }
    for text, expected in cases.items():
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        with pytest.raises(UserError) as err:
            load_keys_file(path)
        assert expected in err.value.message and "\n" not in err.value.message
