"""Routing policies in isolation: each hook's effect on the choice, without engines."""

from __future__ import annotations

import time

from vlmserve.gateway.breaker import CircuitBreaker
from vlmserve.gateway.config import GatewayConfig
from vlmserve.gateway.engine_metrics import EngineLoad, parse_engine_load
from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest, TokenEstimator, block_hashes, describe_request
from vlmserve.gateway.routing import (
    EngineAware,
    LeastOutstandingTokens,
    Outcome,
    PrefixAffinity,
    RoundRobin,
    SessionAffinity,
    build_policy,
    load_bound,
)


def make_replicas(n: int) -> list[Replica]:
    return [Replica(index=i, url=f"http://127.0.0.1:{9000 + i}", breaker=CircuitBreaker(), healthy=True) for i in range(n)]


def req(
    request_id: str, prompt: int = 100, output: int = 50, hashes: list[int] | None = None, session: str | None = None
) -> RoutedRequest:
    return RoutedRequest(
        request_id=request_id,
        model="m",
        stream=True,
        prompt_tokens=prompt,
        expected_output_tokens=output,
        prefix_hashes=hashes or [],
        session_id=session,
    )


def dispatch(policy, request, replica) -> None:
    replica.in_flight += 1
    policy.on_dispatch(request, replica)


def finish(policy, request, replica, outcome=Outcome.COMPLETED) -> None:
    replica.in_flight -= 1
    policy.on_finish(request, replica, outcome)


def test_round_robin_cycles_through_candidates() -> None:
    replicas = make_replicas(3)
    policy = RoundRobin()
    picks = [policy.choose(req(str(i)), replicas).index for i in range(6)]
    assert sorted(picks[:3]) == [0, 1, 2] and picks[:3] == picks[3:]


def test_least_outstanding_tokens_balances_tokens_not_requests() -> None:
    replicas = make_replicas(2)
    policy = LeastOutstandingTokens()
    big = req("big", prompt=4000, output=1000)
    first = policy.choose(big, replicas)
    dispatch(policy, big, first)
    # Several small requests all go to the other replica until it holds as many tokens.
    picks = []
    for i in range(4):
        small = req(f"s{i}", prompt=500, output=100)
        chosen = policy.choose(small, replicas)
        dispatch(policy, small, chosen)
        picks.append(chosen.index)
    assert set(picks) == {1 - first.index}
    assert policy.outstanding[first.index] == 5000
    assert policy.outstanding[1 - first.index] == 2400


def test_least_outstanding_tokens_updates_at_first_token_finish_and_abandon() -> None:
    replicas = make_replicas(2)
    policy = LeastOutstandingTokens()
    a = req("a", prompt=1000, output=200)
    dispatch(policy, a, replicas[0])
    assert policy.outstanding[0] == 1200
    a.engine_prompt_tokens = 2500  # the engine's own count, from the first chunk's usage
    policy.on_first_token(a, replicas[0])
    assert policy.outstanding[0] == 2700
    finish(policy, a, replicas[0])
    assert policy.outstanding[0] == 0
    b = req("b", prompt=300, output=30)
    dispatch(policy, b, replicas[1])
    policy.on_first_token(b, replicas[1])  # no usage in the stream: the estimate stands
    assert policy.outstanding[1] == 330
    finish(policy, b, replicas[1], Outcome.ABANDONED)
    c = req("c", prompt=300, output=30)
    dispatch(policy, c, replicas[1])
    finish(policy, c, replicas[1], Outcome.FAILED)
    assert policy.outstanding == {0: 0, 1: 0}


def test_prefix_affinity_follows_the_longest_prefix() -> None:
    replicas = make_replicas(3)
    policy = PrefixAffinity(load_factor=10.0)
    conversation = [11, 22, 33, 44]
    first = req("a", hashes=conversation[:2])
    home = policy.choose(first, replicas)
    dispatch(policy, first, home)
    finish(policy, first, home)
    # A longer turn of the same conversation goes where its prefix went.
    follow_up = req("b", hashes=conversation)
    assert policy.choose(follow_up, replicas) is home


def test_prefix_affinity_never_exceeds_its_load_bound_on_a_shared_prefix() -> None:
    """Every request shares one system prompt: affinity must not pile them onto one replica."""
    replicas = make_replicas(4)
    policy = PrefixAffinity(load_factor=1.25)
    for i in range(200):
        request = req(f"r{i}", hashes=[1, 2, 3, 100 + i])
        bound = load_bound(replicas, 1.25)
        chosen = policy.choose(request, replicas)
        dispatch(policy, request, chosen)
        assert chosen.in_flight <= bound
        if i % 3 == 0:  # some finish, so loads move
            finish(policy, request, chosen)
    loads = [r.in_flight for r in replicas]
    assert max(loads) <= 1.25 * sum(loads) / len(loads) + 1


def test_prefix_affinity_places_a_new_prefix_consistently() -> None:
    replicas = make_replicas(4)
    policy = PrefixAffinity()
    picks = {policy.choose(req(f"r{i}", hashes=[777, i]), replicas).index for i in range(5)}
    assert len(picks) == 1  # same first block, nothing dispatched yet: same replica every time


def test_engine_aware_prefers_the_idle_engine_and_counts_fresh_dispatches() -> None:
    replicas = make_replicas(2)
    policy = EngineAware()
    now = time.monotonic()
    policy.on_load_update(replicas[0], EngineLoad(waiting=8, running=32, kv_usage=0.9, scraped_at=now))
    policy.on_load_update(replicas[1], EngineLoad(waiting=0, running=4, kv_usage=0.1, scraped_at=now))
    assert policy.choose(req("a"), replicas) is replicas[1]
    # Dispatches the scrape has not seen yet count through the gateway's in-flight number.
    replicas[1].in_flight = 60
    assert policy.choose(req("b"), replicas) is replicas[0]


def test_engine_aware_ignores_stale_scrapes() -> None:
    replicas = make_replicas(2)
    policy = EngineAware(stale_after_s=1.0)
    policy.on_load_update(replicas[0], EngineLoad(waiting=50, running=50, kv_usage=1.0, scraped_at=time.monotonic() - 10))
    replicas[1].in_flight = 3
    assert policy.choose(req("a"), replicas) is replicas[0]


def test_session_affinity_pins_and_yields_when_overloaded() -> None:
    replicas = make_replicas(3)
    policy = SessionAffinity(RoundRobin(), load_factor=2.0)
    first = policy.choose(req("a", session="s1"), replicas)
    assert all(policy.choose(req(f"x{i}", session="s1"), replicas) is first for i in range(5))
    first.in_flight = 10  # far over 2x its fair share
    assert policy.choose(req("y", session="s1"), replicas) is not first


def test_build_policy_wraps_every_policy_in_session_affinity() -> None:
    for name in ("round-robin", "least-outstanding-tokens", "prefix-affinity", "engine-aware"):
        policy = build_policy(GatewayConfig(replicas=["http://127.0.0.1:1"], policy=name))
        assert isinstance(policy, SessionAffinity) and policy.name == name


def test_block_hashes_are_chained_and_skip_the_partial_tail() -> None:
    a = block_hashes("x" * 10 + "y" * 10 + "z" * 5, 10)
    b = block_hashes("x" * 10 + "q" * 10, 10)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]


def test_describe_request_templates_chat_with_images() -> None:
    body = {
        "model": "m",
        "stream": True,
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": "You read dental radiographs. " * 20},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
        ],
    }
    routed = describe_request(body, request_id="r", estimator=TokenEstimator(4.0, 500, 256), prefix_block_chars=64)
    assert routed.expected_output_tokens == 64 and routed.stream and routed.model == "m"
    assert routed.prompt_tokens > 500  # text estimate plus one image
    other = describe_request(
        {**body, "messages": body["messages"][:1]}, request_id="r2", estimator=TokenEstimator(), prefix_block_chars=64
    )
    assert routed.prefix_hashes[: len(other.prefix_hashes)] == other.prefix_hashes


def test_parse_engine_load_reads_only_the_wanted_gauges() -> None:
    text = "\n".join(
        [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            'vllm:num_requests_running{engine="0",model_name="m"} 7.0',
            'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0',
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42',
            'vllm:num_requests_running_something_else{engine="0"} 100.0',
            'vllm:prompt_tokens_total{engine="0"} 12345.0',
        ]
    )
    load = parse_engine_load(text, scraped_at=1.0)
    assert (load.running, load.waiting, load.kv_usage) == (7.0, 3.0, 0.42)


def test_circuit_breaker_ejects_probes_and_readmits() -> None:
    breaker = CircuitBreaker(failures_to_open=2, open_s=5.0, open_max_s=20.0)
    assert not breaker.record_failure(0.0)
    assert breaker.record_failure(0.0)  # ejected
    assert not breaker.available(1.0) and breaker.available(5.0)
    breaker.on_dispatch(5.0)  # the probe
    assert not breaker.available(5.1)  # one probe at a time
    assert breaker.record_failure(5.2)  # probe failed: open again, twice as long
    assert not breaker.available(14.0) and breaker.available(15.3)
    breaker.on_dispatch(15.3)
    breaker.record_success()
    assert breaker.available(15.4) and breaker.state.value == "closed"


async def test_a_busy_replica_is_not_marked_down_by_a_slow_health_check() -> None:
    """/health timing out while the replica serves traffic means busy, not dead; refused means down."""
    import time as clock

    from vlmserve.gateway.replicas import ReplicaPool

    pool = ReplicaPool(["http://127.0.0.1:9"])
    replica = pool.replicas[0]
    replica.healthy = True
    answers: list[tuple[bytes | None, str]] = []

    async def fake_probe(_replica, _path):
        return answers.pop(0)

    pool._probe_status = fake_probe  # type: ignore[method-assign]
    replica.record_success()
    answers[:] = [(None, "timeout")] * 3
    for _ in range(3):
        await pool._check_health(replica)
    assert replica.healthy
    replica.last_success_at = clock.monotonic() - 60  # no traffic answered lately
    answers[:] = [(None, "refused")] * 2
    for _ in range(2):
        await pool._check_health(replica)
    assert not replica.healthy


def image_req(request_id: str, *digests: str, prompt: int = 100) -> RoutedRequest:
    request = req(request_id, prompt=prompt)
    request.image_digests = list(digests)
    request.image_tokens = 60 * len(digests)
    return request


def test_image_affinity_sends_a_repeat_where_its_image_went() -> None:
    from vlmserve.gateway.routing import ImageAffinity

    replicas = make_replicas(3)
    policy = ImageAffinity(load_factor=1.25)
    first = image_req("a1", "img-a")
    home = policy.choose(first, replicas)
    dispatch(policy, first, home)
    finish(policy, first, home)
    for i in range(5):  # every repeat, sent one at a time, lands on the image's replica
        repeat = image_req(f"a-repeat{i}", "img-a")
        chosen = policy.choose(repeat, replicas)
        assert chosen is home
        dispatch(policy, repeat, chosen)
        finish(policy, repeat, chosen)
    assert policy.affinity_hits == 5
    # a holder busier than the saving is worth is passed over
    busy = req("long", prompt=2000, output=500)
    dispatch(policy, busy, home)
    assert policy.choose(image_req("a-late", "img-a"), replicas) is not home
    text = req("text")  # no image: least outstanding tokens
    assert policy.choose(text, replicas) in replicas


def test_image_affinity_never_makes_a_hot_spot() -> None:
    from vlmserve.gateway.routing import ImageAffinity

    replicas = make_replicas(2)
    policy = ImageAffinity(load_factor=1.25)
    placed = []
    for i in range(20):  # a popular image requested 20 times at once
        request = image_req(f"hot{i}", "img-hot")
        bound = load_bound(replicas, 1.25)
        chosen = policy.choose(request, replicas)
        dispatch(policy, request, chosen)
        placed.append(chosen.index)
        assert chosen.in_flight <= bound
    assert abs(placed.count(0) - placed.count(1)) <= 4 and policy.affinity_declined > 0


def test_image_affinity_prefers_the_replica_holding_more_of_the_images() -> None:
    from vlmserve.gateway.routing import ImageAffinity

    replicas = make_replicas(2)
    policy = ImageAffinity()
    for request, replica in ((image_req("x", "a"), replicas[0]), (image_req("y", "b", "c"), replicas[1])):
        dispatch(policy, request, replica)
        finish(policy, request, replica)
    assert policy.choose(image_req("z", "a", "b", "c"), replicas) is replicas[1]


def test_engine_aware_scores_images_held_under_the_bound() -> None:
    replicas = make_replicas(2)
    policy = EngineAware(load_factor=1.25)
    seen = image_req("seen", "img")
    dispatch(policy, seen, replicas[1])
    finish(policy, seen, replicas[1])
    # equal engine figures: the replica that holds the image wins
    assert policy.choose(image_req("again", "img"), replicas) is replicas[1]


def test_image_digests_feed_prefix_hashes() -> None:
    estimator = TokenEstimator()
    DIGEST = "0f" * 16  # noqa: N806

    def body(url: str, question: str) -> dict:
        return {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}],
                }
            ]
        }

    one = describe_request(
        body("data:image/png;base64,AAAA", "what is this?" * 40),
        request_id="1",
        estimator=estimator,
        prefix_block_chars=32,
        image_digests=[DIGEST],
        image_tokens=34,
    )
    two = describe_request(
        body("https://elsewhere/x.png", "and this one?" * 40),
        request_id="2",
        estimator=estimator,
        prefix_block_chars=32,
        image_digests=[DIGEST],
        image_tokens=34,
    )
    # same image (same digest, whatever URL carried it), different question: the blocks up to the
    # end of the image are shared, the question's are not
    assert one.prefix_hashes[0] == two.prefix_hashes[0] and one.prefix_hashes[-1] != two.prefix_hashes[-1]
    assert one.image_digests == [DIGEST] and one.prompt_tokens > 34  # the image's own estimate, not 576


def test_expected_output_counts_every_choice() -> None:
    from vlmserve.gateway.request_info import expected_output_tokens

    assert expected_output_tokens({"max_tokens": 100, "n": 3}, 256) == 300
    assert expected_output_tokens({"n": 2}, 256) == 512
    assert expected_output_tokens({"max_tokens": 100, "n": True}, 256) == 100
