"""LoRA adapters at the gateway: which served names are adapters, who may use them, and their metrics.

vLLM lists each adapter in /v1/models with a `parent` (the base model), so the replicas' lists say
which names are adapters. A tenant may be limited to some adapters (`adapters:` in the keys file)
and barred from the base model (`base_model: false`): a 403 names what it may use. A name no replica
serves is a 404 naming what this tenant may use (never the adapters of other tenants). Adapters get
their own metric series, labelled by name for the first MAX_ADAPTER_LABELS names seen and `other`
beyond, so adapters loaded at run time cannot grow the label set without bound.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from vlmserve.gateway.admission import AdmissionRejected, Tenant
from vlmserve.gateway.metrics import LATENCY_BUCKETS_S
from vlmserve.gateway.replicas import ReplicaPool

MAX_ADAPTER_LABELS = 64
"""Distinct adapter names on the gateway's metrics; later ones share the label `other`."""
OTHER_ADAPTERS = "other"


class AdapterCatalog:
    """The served adapters (from the healthy replicas' /v1/models), rebuilt only when a list changes."""

    def __init__(self, pool: ReplicaPool, registry: CollectorRegistry) -> None:
        self.pool = pool
        self.adapters: frozenset[str] = frozenset()
        self.bases: frozenset[str] = frozenset()
        self._lists: tuple[int, ...] = ()  # identities of the lists the sets were built from
        self._labels: dict[str, str] = {}
        self.in_flight: dict[str, int] = {}  # admitted requests per adapter not yet finished (adapter_admin.py)
        self.requests = Counter(
            "vlmserve_gateway_adapter_requests",
            "Requests for a LoRA adapter by final status (adapter: its name, or other past the label bound)",
            ["adapter", "status"],
            registry=registry,
        )
        self.ttft = Histogram(
            "vlmserve_gateway_adapter_time_to_first_token_seconds",
            "Request received to first byte sent, for requests naming a LoRA adapter",
            ["adapter"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )

    def refresh(self) -> None:
        lists = tuple(id(replica.models) for replica in self.pool.replicas if replica.healthy)
        if lists == self._lists:
            return
        self._lists = lists
        entries = self.pool.known_models().values()
        self.adapters = frozenset(str(entry["id"]) for entry in entries if entry.get("parent"))
        self.bases = frozenset(str(entry["id"]) for entry in entries if not entry.get("parent"))

    def allowed(self, tenant: Tenant, model: str) -> bool:
        """May `tenant` use the served name `model` (an adapter or a base model)?"""
        if model in self.adapters:
            return tenant.adapters is None or model in tenant.adapters
        return tenant.base_model

    def visible(self, tenant: Tenant, models: dict[str, dict]) -> dict[str, dict]:
        """The /v1/models entries `tenant` may use."""
        if tenant.adapters is None and tenant.base_model:
            return models
        self.refresh()
        return {name: entry for name, entry in models.items() if self.allowed(tenant, name)}

    def adapter_of(self, model: str | None) -> str | None:
        """`model` when it names a served adapter (for the audit line and metrics, refused or not), else None."""
        self.refresh()
        return model if model in self.adapters else None

    def check(self, tenant: Tenant, model: str | None) -> str | None:
        """The adapter a request names (None: the base model), or 404 / 403 as the module says."""
        self.refresh()
        restricted = tenant.adapters is not None or not tenant.base_model
        # a restricted tenant needs the name listed (closed until the replicas' lists are known)
        known = (model in self.adapters or model in self.bases) if restricted else self.pool.lists_model(model or "")
        if model is not None and not known:
            mine = sorted(self.visible(tenant, self.pool.known_models()))
            raise AdmissionRejected(
                404,
                f"model {model!r} is not served here: choose one of "
                f"{', '.join(mine) or 'nothing (this key may use no served model)'}",
                "model_not_found",
            )
        if model is None and not tenant.base_model:
            raise self._forbidden(tenant, "the base model (a request without 'model')")
        if model is not None and not self.allowed(tenant, model):
            raise self._forbidden(tenant, f"adapter {model!r}" if model in self.adapters else f"the base model {model!r}")
        if model not in self.adapters:
            return None
        self.in_flight[model] = self.in_flight.get(model, 0) + 1  # `release` when the request ends
        return model

    def release(self, adapter: str) -> None:
        """An admitted request for `adapter` (check's answer) ended."""
        left = self.in_flight.get(adapter, 0) - 1
        if left > 0:
            self.in_flight[adapter] = left
        else:
            self.in_flight.pop(adapter, None)

    def _forbidden(self, tenant: Tenant, what: str) -> AdmissionRejected:
        names = sorted(self.visible(tenant, self.pool.known_models()))
        return AdmissionRejected(
            403,
            f"tenant {tenant.name!r} may not use {what}: it may use {', '.join(names) or 'no served model'}",
            "model_not_allowed",
        )

    def label(self, adapter: str) -> str:
        """The adapter's metric label: its name while under MAX_ADAPTER_LABELS names, else `other`."""
        label = self._labels.get(adapter)
        if label is None:
            label = adapter if len(self._labels) < MAX_ADAPTER_LABELS else OTHER_ADAPTERS
            if label != OTHER_ADAPTERS:
                self._labels[adapter] = label
        return label

    def observe(self, adapter: str, status: str, ttft_s: float | None) -> None:
        label = self.label(adapter)
        self.requests.labels(label, status).inc()
        if ttft_s is not None:
            self.ttft.labels(label).observe(ttft_s)
