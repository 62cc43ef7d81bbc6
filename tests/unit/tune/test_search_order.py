"""Which candidates a tune measures: the baseline, the planner's best, then Optuna; and which one it recommends.

The planner here is the real one (the sim engine's scheduler on the virtual clock) on a rehearsal
cost model whose optimum is known; the proposer is the real Optuna sampler.
"""

from __future__ import annotations

import pytest

from vlmserve.bench.slo_search import SearchSpace
from vlmserve.spec import SLO, DeploymentSpec, LoadSpec
from vlmserve.tune import predict as predict_module
from vlmserve.tune.predict import Prediction, can_predict, predict
from vlmserve.tune.propose import Proposer
from vlmserve.tune.recommend import recommend
from vlmserve.tune.space import TuneSpace
from vlmserve.tune.store import CandidateRecord, Interval

OPTIMUM = {"max_num_seqs": 16, "max_num_batched_tokens": 1024}
BASE = DeploymentSpec.model_validate(
    {
        "name": "r",
        "engine": "sim",
        "model": "m",
        "gateway": False,
        "engine_args": {"max_num_seqs": 64, "max_num_batched_tokens": 4096},
        "sim": {"profile": "a10g-8b", "rehearsal_optimum": OPTIMUM},
    }
)
LOAD = LoadSpec(rate=1, duration_s=2, input_len=128, output_len=16, arrival="constant")
SLO_ = SLO.parse("ttft_p95=400ms")
RATES = SearchSpace("rate", 1, 32, 0.3, 6)


def _measured(candidate_id: str, order: int, low: float, high: float | None, baseline: bool = False) -> CandidateRecord:
    return CandidateRecord(
        id=candidate_id,
        label=candidate_id,
        params={"max_num_seqs": order},
        baseline=baseline,
        order=order,
        status="measured",
        goodput_rps=low,
        interval=Interval(low=low, high=high),
    )


def test_the_planner_ranks_the_constructed_optimum_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(predict_module, "MIN_SIMULATED_REQUESTS", 40)
    space = TuneSpace.parse(BASE, ["max-num-seqs=8,16,64", "max-num-batched-tokens=1024,4096"])
    assert can_predict(BASE) is None
    predictions = {candidate.id: predict(space.spec_for(candidate), LOAD, SLO_, RATES) for candidate in space.candidates()}
    best = max(space.candidates(), key=lambda candidate: predictions[candidate.id].goodput_rps or 0.0)
    assert best.params == OPTIMUM
    baseline = space.candidates()[0]
    assert (predictions[baseline.id].goodput_rps or 0.0) < (predictions[best.id].goodput_rps or 0.0) / 2


def test_a_candidate_that_would_not_start_is_predicted_as_such() -> None:
    spec = BASE.model_copy(update={"engine_args": BASE.engine_args.model_copy(update={"max_model_len": 1 << 20})})
    prediction = predict(spec, LOAD, SLO_, RATES)
    assert prediction.goodput_rps is None and prediction.reason is not None
    assert prediction.reason.startswith("would not start: the KV cache")


def test_no_planner_model_for_vllm_specs() -> None:
    assert can_predict(DeploymentSpec(name="v", engine="vllm")) == (
        "no planner model of the vLLM engine on this machine (the planner prices GPUs)"
    )


def test_baseline_first_then_planner_picks_then_optuna_without_repeats() -> None:
    space = TuneSpace.parse(BASE, ["max-num-seqs=4,8,16,64", "max-num-batched-tokens=512,1024,4096"])
    candidates = space.candidates()
    predictions = {candidate.id: Prediction(float(index)) for index, candidate in enumerate(candidates)}
    proposer = Proposer(space, predictions, budget=5)
    records: list[CandidateRecord] = []
    whys = []
    while (proposal := proposer.next(records)) is not None and len(records) < 12:
        whys.append(proposal.why)
        assert proposal.candidate.id not in {record.id for record in records}, "never proposes a measured point"
        records.append(
            CandidateRecord(
                id=proposal.candidate.id,
                label=proposal.candidate.label,
                params=dict(proposal.candidate.params),
                baseline=proposal.candidate.baseline,
                order=len(records),
                status="measured",
                goodput_rps=1.0,
                interval=Interval(low=1.0, high=2.0),
            )
        )
    assert whys[:3] == ["baseline", "planner", "planner"]  # (5 - 1) / 2 planner slots
    assert [record.id for record in records[1:3]] == [candidates[-1].id, candidates[-2].id], "highest predicted first"
    assert set(whys[3:]) <= {"optuna", "fallback"} and whys.count("optuna") >= 3
    assert len(records) == 12 and proposer.next(records) is None, "every candidate once, then nothing"


def test_a_resumed_proposer_proposes_what_an_uninterrupted_one_would() -> None:
    space = TuneSpace.parse(BASE, ["max-num-seqs=4,8,16,64", "max-num-batched-tokens=512,1024,4096"])
    records = [
        _measured(candidate.id, index, 1.0 + index, 2.0 + index, candidate.baseline)
        for index, candidate in enumerate(space.candidates()[:4])
    ]
    records = [
        record.model_copy(update={"params": dict(candidate.params)}) for record, candidate in zip(records, space.candidates()[:4])
    ]
    first = Proposer(space, {}, budget=8, seed=3).next(records)
    second = Proposer(space, {}, budget=8, seed=3).next(records)
    assert first is not None and second is not None and first.candidate.id == second.candidate.id


def test_recommends_the_winner_only_when_the_baseline_missed_where_it_held() -> None:
    baseline = _measured("base", 0, 2.0, 3.0, baseline=True)
    winner = _measured("fast", 1, 6.0, 7.0)
    close = _measured("close", 2, 5.0, 6.5)
    choice = recommend([baseline, winner, close])
    assert choice.chosen is winner and choice.best is winner
    assert choice.within_interval == ["close"], "close missed at 6.5 > 6.0 held: not told apart from the winner"
    assert choice.sentence.startswith("fast beats the baseline: goodput 6–7 req/s against 2–3 req/s")


def test_keeps_the_baseline_when_it_cannot_be_told_apart() -> None:
    baseline = _measured("base", 0, 5.0, 8.0, baseline=True)
    best = _measured("fast", 1, 6.0, 7.0)
    choice = recommend([baseline, best])
    assert choice.chosen is baseline and choice.best is best
    assert "cannot be told apart from the best candidate" in choice.sentence and "keeping the baseline" in choice.sentence


def test_nothing_met_the_slo_and_nothing_measured() -> None:
    assert recommend([]).chosen is None
    zero = recommend([_measured("base", 0, 0.0, 1.0, baseline=True)])
    assert zero.chosen is None and "lower the range or loosen the SLOs" in zero.sentence
