"""Tenants limited to LoRA adapters: 403 for what a key may not use, 404 naming what it may, bounded metric labels."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from vlmserve.errors import UserError
from vlmserve.gateway.adapters import MAX_ADAPTER_LABELS, OTHER_ADAPTERS, AdapterCatalog
from vlmserve.gateway.admission import AdmissionRejected, Tenant, TenantSpec, load_keys_file
from vlmserve.gateway.replicas import ReplicaPool

BASE = {"id": "embedded", "root": "/m", "parent": None}


def adapter(name: str) -> dict:
    return {"id": name, "root": f"/a/{name}", "parent": "embedded"}


def catalog(*lists: list[dict], registry: CollectorRegistry | None = None) -> AdapterCatalog:
    pool = ReplicaPool([f"http://127.0.0.1:{8000 + i}" for i in range(len(lists))])
    for replica, listed in zip(pool.replicas, lists):
        replica.healthy, replica.models = True, listed
    return AdapterCatalog(pool, registry or CollectorRegistry())


def tenant(**spec: object) -> Tenant:
    return Tenant.from_spec(TenantSpec.model_validate({"name": "clinic", "keys": ["k"], **spec}))


def refused(served: AdapterCatalog, who: Tenant, model: str | None) -> AdmissionRejected:
    with pytest.raises(AdmissionRejected) as caught:
        served.check(who, model)
    return caught.value


def test_adapters_are_told_from_base_models_by_their_parent() -> None:
    served = catalog([BASE, adapter("clinic-a")], [BASE, adapter("tutor")])
    anyone = tenant()
    assert served.check(anyone, "clinic-a") == "clinic-a" and served.check(anyone, "tutor") == "tutor"
    assert served.check(anyone, "embedded") is None and served.check(anyone, None) is None
    served.pool.replicas[1].models = [BASE]  # an adapter unloaded: the next request sees the new list
    assert refused(served, anyone, "tutor").status == 404 and served.adapters == frozenset({"clinic-a"})


@pytest.mark.hostile("gateway: a key limited to adapter A asks for adapter B, and for the base model it may not use: 403")
def test_a_key_limited_to_its_adapter_gets_403_for_others_and_the_base() -> None:
    served = catalog([BASE, adapter("clinic-a"), adapter("clinic-b")])
    only_a = tenant(adapters=["clinic-a"], base_model=False)
    assert served.check(only_a, "clinic-a") == "clinic-a"
    other = refused(served, only_a, "clinic-b")
    assert other.status == 403 and other.code == "model_not_allowed"
    assert other.message == "tenant 'clinic' may not use adapter 'clinic-b': it may use clinic-a"
    base = refused(served, only_a, "embedded")
    assert base.status == 403 and base.message == "tenant 'clinic' may not use the base model 'embedded': it may use clinic-a"
    assert refused(served, only_a, None).status == 403  # no model named: vLLM would answer with the base model
    with_base = tenant(adapters=["clinic-a"])  # base_model defaults to allowed
    assert served.check(with_base, "embedded") is None and refused(served, with_base, "clinic-b").status == 403
    base_only = tenant(adapters=[])
    assert refused(served, base_only, "clinic-a").message.endswith("it may use embedded")


@pytest.mark.hostile("gateway: an unknown adapter is a 404 naming what the key may use, never other tenants' adapters")
def test_unknown_models_are_404_naming_what_this_key_may_use() -> None:
    served = catalog([BASE, adapter("clinic-a"), adapter("clinic-b")])
    anyone = refused(served, tenant(), "clinic-z")
    assert anyone.status == 404 and anyone.code == "model_not_found"
    assert anyone.message == "model 'clinic-z' is not served here: choose one of clinic-a, clinic-b, embedded"
    only_a = refused(served, tenant(adapters=["clinic-a"], base_model=False), "clinic-z")
    assert only_a.message == "model 'clinic-z' is not served here: choose one of clinic-a"
    assert set(served.visible(tenant(adapters=["clinic-a"], base_model=False), served.pool.known_models())) == {"clinic-a"}
    unknown_lists = catalog([])  # no replica has listed its models yet
    assert unknown_lists.check(tenant(), "anything") is None  # the engine decides, as before
    assert refused(unknown_lists, tenant(adapters=["a"]), "a").status == 404  # a limited key: closed until known


@pytest.mark.hostile("keys file: a tenant's adapter list with a name no adapter can have: one line naming the tenant")
def test_keys_file_adapter_names_are_checked(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  - name: clinic\n    keys: [k]\n    adapters: ['../etc']\n")
    with pytest.raises(UserError) as caught:
        load_keys_file(keys)
    assert "tenant 'clinic': adapter name '../etc' is not allowed" in caught.value.message


@pytest.mark.hostile("gateway: requests naming thousands of adapters keep the adapter metric labels bounded")
def test_adapter_labels_are_bounded() -> None:
    registry = CollectorRegistry()
    served = catalog([BASE], registry=registry)
    for index in range(MAX_ADAPTER_LABELS + 50):
        served.observe(f"lora-{index}", "200", 0.01)
    labels = {served.label(f"lora-{index}") for index in range(MAX_ADAPTER_LABELS + 50)}
    assert len(labels) == MAX_ADAPTER_LABELS + 1 and OTHER_ADAPTERS in labels
    assert served.label("lora-0") == "lora-0" and served.label(f"lora-{MAX_ADAPTER_LABELS}") == OTHER_ADAPTERS
    text = generate_latest(registry).decode()
    assert 'vlmserve_gateway_adapter_requests_total{adapter="other",status="200"} 50.0' in text
    assert 'vlmserve_gateway_adapter_time_to_first_token_seconds_count{adapter="lora-0"} 1.0' in text
