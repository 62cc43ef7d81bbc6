"""Merging servers' Prometheus pages (prometheus_text.merge_pages): every sample labelled with its
source, one HELP and TYPE per family, the result read back by prometheus_client's own parser, and a
bad page left out and named rather than spoiling the rest."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vlmserve.prometheus_text import MAX_PAGE_BYTES, merge_pages

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"

ENGINE_PAGE = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
# HELP vllm:time_to_first_token_seconds TTFT.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="m"}} 3.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} 4.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} 0.5
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} 4.0
# HELP process_open_fds Number of open file descriptors.
# TYPE process_open_fds gauge
process_open_fds 17.0
"""


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) → value, as Prometheus' own client parser reads the page."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_each_sample_is_labelled_with_its_replica_and_families_stay_whole() -> None:
    merged = merge_pages([(A, ENGINE_PAGE.format(kv=0.25, queries=100)), (B, ENGINE_PAGE.format(kv=0.75, queries=40))], "replica")
    read = samples(merged)
    labels = (("engine", "0"), ("model_name", "m"))
    assert read[("vllm:kv_cache_usage_perc", tuple(sorted((*labels, ("replica", A)))))] == 0.25
    assert read[("vllm:kv_cache_usage_perc", tuple(sorted((*labels, ("replica", B)))))] == 0.75
    assert read[("vllm:prefix_cache_queries_total", tuple(sorted((*labels, ("replica", B)))))] == 40
    # a sample with no labels of its own gets the one label
    assert read[("process_open_fds", (("replica", A),))] == 17.0
    assert len(read) == 2 * 7  # seven samples on each page, none lost or merged
    lines = merged.splitlines()
    for family in (
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:time_to_first_token_seconds",
        "process_open_fds",
    ):
        assert sum(line.startswith(f"# HELP {family} ") for line in lines) == 1
        assert sum(line.startswith(f"# TYPE {family} ") for line in lines) == 1
        # the format's rule: one family's lines together, after its HELP and TYPE
        at = [i for i, line in enumerate(lines) if line.split("{")[0].split(" ")[0].startswith(family)]
        assert at == list(range(at[0], at[0] + len(at))), family
    histogram = next(f for f in text_string_to_metric_families(merged) if f.name == "vllm:time_to_first_token_seconds")
    assert histogram.type == "histogram" and len(histogram.samples) == 8


def test_a_failed_replica_is_named_in_a_comment_and_the_rest_is_served() -> None:
    merged = merge_pages([(A, ENGINE_PAGE.format(kv=0.5, queries=1))], "replica", [(B, "timeout")])
    assert f"# replica {B} left out: timeout" in merged.splitlines()
    assert {labels for _, labels in samples(merged)} == {
        (("replica", A),),
        (("engine", "0"), ("model_name", "m"), ("replica", A)),
    } | {(("engine", "0"), ("le", le), ("model_name", "m"), ("replica", A)) for le in ("0.1", "+Inf")}
    assert merge_pages([], "replica") == "\n"  # no replica: an empty page, still valid


def test_a_label_named_like_ours_is_kept_as_exported_and_timestamps_pass() -> None:
    page = 'up{replica="self",job="x"} 1 1700000000000\nother_metric 2\n# EOF\n'
    merged = merge_pages([(A, page)], "replica")
    assert merged.splitlines() == [
        f'up{{replica="{A}",exported_replica="self",job="x"}} 1 1700000000000',
        f'other_metric{{replica="{A}"}} 2',
    ]


@pytest.mark.hostile(
    "gateway /admin/engine-metrics: a replica's sample with '}', ',', '\\\"' and '=' inside a quoted label "
    "value is relabelled as one sample, the value kept byte for byte"
)
def test_a_brace_inside_a_label_value_is_part_of_the_value() -> None:
    page = 'vllm:lora_requests_info{running="a},b=\\"c\\"",max_lora="2"} 5\n'
    merged = merge_pages([(A, page)], "replica")
    (((name, labels), value),) = samples(merged).items()
    assert name == "vllm:lora_requests_info" and value == 5
    assert dict(labels) == {"replica": A, "running": 'a},b="c"', "max_lora": "2"}


@pytest.mark.hostile(
    "gateway /admin/engine-metrics: a replica page with a malformed line (unclosed label set, label "
    "text after the value, a value that is no number, pairs without a comma, an unquoted value, no name, "
    "an unknown TYPE) is left out whole and named; the other replicas are served"
)
@pytest.mark.parametrize(
    "bad",
    [
        'vllm:x{a="b" 1',
        'vllm:x 1 {a="b"}',
        'vllm:x{a="b"} one',
        'vllm:x{a="b"c="d"} 1',
        "vllm:x{a=b} 1",
        '{a="b"} 1',
        "# TYPE vllm:x countr\nvllm:x 1",
    ],
)
def test_a_malformed_page_is_left_out_and_named(bad: str) -> None:
    merged = merge_pages([(A, f"good 1\n{bad}\n"), (B, "good 2\n")], "replica")
    assert samples(merged) == {("good", (("replica", B),)): 2.0}
    assert merged.startswith(f"# replica {A} left out: line 2: ")


@pytest.mark.hostile(
    "gateway /admin/engine-metrics: a replica page over 8 MiB, or not UTF-8, is refused whole and "
    "named; the source's name cannot break out of its comment line"
)
def test_an_oversized_or_undecodable_page_is_refused() -> None:
    huge = b"x 1\n" * (MAX_PAGE_BYTES // 4 + 1)
    merged = merge_pages(
        [(A, huge), (B, b"y \xff\n"), ("http://c/\nevil 1", b"z 3\n")], "replica", [("http://d/\nevil 2", "why\nevil 3")]
    )
    lines = merged.splitlines()
    assert lines[0] == "# replica http://d/?evil 2 left out: why?evil 3"
    assert lines[1] == f"# replica {A} left out: page of {len(huge):,} bytes, over the {MAX_PAGE_BYTES:,}-byte limit"
    assert lines[2] == f"# replica {B} left out: page is not UTF-8"
    assert samples(merged) == {("z", (("replica", "http://c/\nevil 1"),)): 3.0}  # escaped as a label value


def test_two_sim_engine_pages_merge_into_one_prometheus_reads_whole() -> None:
    """The sim engine's page is written by prometheus_client as vLLM's is (counters' `_created`
    families, histograms): merged, every sample survives, twice, each replica's apart."""
    from prometheus_client import generate_latest

    from vlmserve.engines.sim.metrics import EngineMetrics

    pages = []
    for source, queries in ((A, 7), (B, 5)):
        engine = EngineMetrics("m")
        engine.prefix_cache_queries.inc(queries)
        pages.append((source, generate_latest(engine.registry)))
    one = samples(pages[0][1].decode())
    merged = samples(merge_pages(pages, "replica"))
    assert len(merged) == 2 * len(one) > 50
    queries = {
        dict(labels)["replica"]: value for (name, labels), value in merged.items() if name == "vllm:prefix_cache_queries_total"
    }
    assert queries == {A: 7.0, B: 5.0}
