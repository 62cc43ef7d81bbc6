"""The bounds every reader of a user's file goes through (`vlmserve.bounded_read`)."""

from __future__ import annotations

import io

import pytest

from vlmserve import bounded_read
from vlmserve.bounded_read import (
    CONFIG_FILE,
    MAX_DEPTH,
    MAX_INT_DIGITS,
    Limits,
    Refused,
    iter_lines,
    json_shape,
    loads_json,
    printable,
    yaml_shape,
)

SMALL = Limits("test file", max_bytes=1000, max_items=20, max_depth=4)


def test_json_within_the_bounds_is_parsed_as_json_loads_would() -> None:
    assert loads_json(b'{"a": [1, -2.5e3, "x\\"[[[[[["], "b": {"c": null}}', SMALL) == {
        "a": [1, -2500.0, 'x"[[[[[['],
        "b": {"c": None},
    }
    assert loads_json('"\\ud800"', SMALL) == "\ud800"  # a lone surrogate escape is JSON; callers decide


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 5 + "]" * 5, "nests deeper than 4 levels (the limit for a test file)"),
        ("[" * 100_000 + "]" * 100_000, "nests deeper than 4 levels"),
        ("[" + "1," * 30 + "1]", "holds about 31 values, over the 20 limit for a test file"),
        ("x" * 1001, "is 1,001 bytes, over the 1,000-byte limit for a test file"),
        ("[NaN]", "has NaN, which is not a finite number; a test file takes finite numbers only"),
        ('{"a": -Infinity}', "has -Infinity, which is not a finite number"),
        ("[1e999]", "has the number 1e999, which is not finite"),
        (
            "[" + "9" * (MAX_INT_DIGITS + 1) + "]",
            f"has an integer of {MAX_INT_DIGITS + 1} digits, over the {MAX_INT_DIGITS}-digit limit",
        ),
    ],
)
def test_json_over_a_bound_is_refused_with_the_bound_named(text: str, message: str) -> None:
    with pytest.raises(Refused) as refused:
        loads_json(text, SMALL if len(text) < 100_000 else Limits("big", 10**6, 10**6, max_depth=4))
    assert message in str(refused.value)


def test_brackets_inside_strings_and_escapes_do_not_count() -> None:
    assert json_shape(b'{"a": "[[[[[[[[\\\\", "b": "\\"]]]]{{{{"}', max_depth=2, max_items=10) is None
    assert json_shape(b"[[[", max_depth=2, max_items=10) == ("too_deep", 3)


def test_config_limits_take_a_real_config() -> None:
    config = (
        b'{"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {"rope_scaling": {"factor": 8.0}},'
        b' "model_max_length": 1000000000000000019884624838656, "vision_config": {"image_size": 896}}'
    )
    assert loads_json(config, CONFIG_FILE)["vision_config"] == {"image_size": 896}


def test_yaml_alias_bomb_is_refused_before_it_is_built() -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"{chr(98 + level)}: &{chr(98 + level)} [{', '.join([f'*{chr(97 + level)}'] * 10)}]" for level in range(8)]
    with pytest.raises(Refused, match="has over 1,000,000 values with its aliases expanded, the limit for a config file"):
        yaml_shape("\n".join(lines), CONFIG_FILE)


def test_yaml_depth_is_refused_even_past_libyamls_own_limit() -> None:
    for depth in (MAX_DEPTH + 1, 100_000):
        with pytest.raises(Refused, match=f"nests deeper than {MAX_DEPTH} levels"):
            yaml_shape("a: " + "[" * depth + "]" * depth, CONFIG_FILE)


def test_yaml_with_a_few_aliases_passes() -> None:
    yaml_shape("base: &base {gpu: 1}\nreplicas:\n  - *base\n  - <<: *base\n    port: 9\n", CONFIG_FILE)


@pytest.mark.parametrize(
    ("data", "lines"),
    [
        (b"a\nbb\r\nccc\rdd", [b"a", b"bb", b"ccc", b"dd"]),
        (b"a\r", [b"a"]),
        (b"a\r\r\n", [b"a", b""]),
        (b"x" * 10 + b"\nyy\r\n" + b"z" * 11, [None, b"yy", None]),
        (b"abc\r\ndef\r", [b"abc", b"def"]),
    ],
)
def test_lf_crlf_and_cr_end_lines_and_long_lines_are_skipped(
    data: bytes, lines: list[bytes | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bounded_read, "_LINE_CHUNK", 3)  # every CRLF split across reads somewhere
    assert list(iter_lines(io.BytesIO(data), 5)) == lines


def test_printable_shows_control_characters_instead_of_obeying_them() -> None:
    assert printable("run \x1b[2J\x1b]0;pwned\x07 \r\u202eok") == "run \\x1b[2J\\x1b]0;pwned\\x07 \\r\\u202eok"
    assert printable("é ü 中文") == "é ü 中文"
    assert len(printable("x" * 500)) == 200
