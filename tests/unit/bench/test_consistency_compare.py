"""The consistency check's judging rules: which unit an answer is compared in, where two answers
first differ, and what counts as an image swap."""

from __future__ import annotations

import pytest

from vlmserve.bench.consistency.compare import (
    Answer,
    CaseResult,
    ConsistencyReport,
    answer_from_response,
    find_image_swaps,
    first_difference,
    same_as_other,
)


def _response(text: str, **choice: object) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, **choice}]}


def test_answer_prefers_token_ids_then_logprob_tokens_then_text() -> None:
    logprobs = {"content": [{"token": " a", "logprob": -0.5}, {"token": " b", "logprob": -1.0}]}
    with_ids = answer_from_response(_response(" a b", token_ids=[7, 9], logprobs=logprobs))
    assert with_ids.unit == "token_id" and with_ids.sequence == (7, 9) and with_ids.logprobs == (-0.5, -1.0)
    tokens = answer_from_response(_response(" a b", logprobs=logprobs))
    assert tokens.unit == "token" and tokens.sequence == (" a", " b")
    text = answer_from_response(_response("ab", logprobs=None))
    assert text.unit == "char" and text.sequence == ("a", "b")
    assert answer_from_response(_response(None)).text == ""  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no choices"):
        answer_from_response({"choices": []})


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 5, 3], 1), ([1, 2], [1, 2, 3], 2), ([], [], None), ([4], [], 0)],
)
def test_first_difference(left: list[int], right: list[int], expected: int | None) -> None:
    assert first_difference(left, right) == expected


def test_mixed_units_fall_back_to_characters() -> None:
    case = CaseResult("t", "text", alone=Answer(" ab", (1, 2), "token_id"), loaded=Answer(" ax", (" a", " x"), "token"))
    assert case.unit == "char" and case.first_difference == 2 and case.first_difference_char == 2


def test_identical_answers_report_their_logprob_drift() -> None:
    case = CaseResult(
        "t", "text", alone=Answer("ab", (1, 2), "token_id", (-0.1, -0.2)), loaded=Answer("ab", (1, 2), "token_id", (-0.1, -0.25))
    )
    assert case.identical and case.max_logprob_delta == pytest.approx(0.05)


def _image(case_id: str, alone: str, loaded: str) -> CaseResult:
    return CaseResult(case_id, "image", alone=Answer(alone), loaded=Answer(loaded))


def test_image_swap_is_another_images_answer_or_a_shared_answer() -> None:
    results = [_image("a", "cat", "dog"), _image("b", "dog", "dog"), _image("c", "sun", "moon"), _image("d", "sky", "moon")]
    swaps = find_image_swaps(results, {case.case_id: "q" for case in results})
    assert [(s.case_id, s.other_case_id) for s in swaps] == [("a", "b"), ("c", "d")]
    assert "got the answer b's image gets alone" in swaps[0].how
    assert "got the same answer; alone they differ" in swaps[1].how
    assert same_as_other(results[0], results) == "b" and same_as_other(results[2], results) is None


def test_images_the_server_cannot_tell_apart_are_not_a_swap() -> None:
    results = [_image("a", "same", "other"), _image("b", "same", "other")]
    assert find_image_swaps(results, {"a": "q", "b": "q"}) == []
    # different questions are never compared
    results = [_image("a", "cat", "dog"), _image("b", "dog", "dog")]
    assert find_image_swaps(results, {"a": "q1", "b": "q2"}) == []


def test_report_problems_decide_the_verdict() -> None:
    ok = CaseResult("t0", "text", alone=Answer("x"), loaded=Answer("x"))
    changed = CaseResult("t1", "text", alone=Answer("x"), loaded=Answer("y"))
    failed = CaseResult("t2", "text", alone=Answer("x"), error="under load: HTTP 500: boom")
    report = ConsistencyReport("http://h", "m", 4, 0.5, 3, False, [ok, changed], [])
    assert report.identical_fraction == 0.5 and report.passed
    report.min_identical = 1.0
    assert report.problems == ["identical fraction 0.500 is below --min-identical 1"]
    report = ConsistencyReport("http://h", "m", 4, 0.0, 3, False, [ok, failed], [])
    assert report.problems == ["1 checked request(s) got no answer"]
    data = report.to_dict()
    assert data["compared"] == 1 and data["cases"][1]["error"] == "under load: HTTP 500: boom"
