"""Which models the replica set serves, as asked on every request (replicas.py)."""

from __future__ import annotations

from vlmserve.gateway.replicas import ReplicaPool


def _pool(*models: list[dict] | None) -> ReplicaPool:
    pool = ReplicaPool([f"http://127.0.0.1:{8000 + i}" for i in range(len(models))])
    for replica, listed in zip(pool.replicas, models):
        replica.healthy = listed is not None
        replica.models = listed or []
    return pool


def test_a_model_is_listed_by_a_healthy_replica_or_nobody_has_listed_any() -> None:
    pool = _pool([{"id": "a"}], [{"id": "b"}], None)
    assert pool.lists_model("a") and pool.lists_model("b") and not pool.lists_model("c")
    assert sorted(pool.known_models()) == ["a", "b"]  # what the 404 names
    assert _pool([], None).lists_model("anything")  # no list fetched yet: the engine decides
    assert _pool([{"object": "model"}]).lists_model("anything")  # entries without ids list nothing


def test_a_replaced_model_list_is_seen_and_an_unhealthy_replica_lists_nothing() -> None:
    pool = _pool([{"id": "a"}], [{"id": "b"}])
    replica = pool.replicas[0]
    assert replica.model_ids == {"a"} and replica.name == "127.0.0.1:8000"
    replica.models = [{"id": "a2"}]  # the health loop replaces the list on refresh
    assert replica.model_ids == {"a2"} and not pool.lists_model("a") and pool.lists_model("a2")
    pool.replicas[1].healthy = False
    assert not pool.lists_model("b")
