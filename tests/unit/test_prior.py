"""Prior corrections (prior.py, prior_reads.py and read.py, calibration/bias.py) against a scripted backend
whose reads add a known prior whatever the input says: the content-free prior is removed exactly and
read once per distinct question, a fitted bias applies by position, and the per-type choice keeps a
correction only where it helps on held-out folds."""

from __future__ import annotations

import math
import random

import pytest

from tests.unit.asking import read_question
from vllm.entrypoints.generate.decisions.calibration.bias import (
    Sample,
    choose,
    fit,
)
from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
)
from vllm.entrypoints.generate.decisions.decide.questions import CHOICE, ChoiceQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.prior import (
    NEUTRAL_INPUTS,
    PriorCache,
)
from vllm.entrypoints.generate.decisions.decide.reading.prior_reads import (
    Correction,
)
from vllm.entrypoints.generate.decisions.decide.scoring import (
    adjusted,
)
from vllm.entrypoints.generate.decisions.decide.settings import NO_DEBIAS, parse_debias

from .fakes import one_read

# The model's lean by position, whatever the input; the evidence an input carries, by option value.
PRIOR = [1.2, 0.4, -0.3]
EVIDENCE = {"billing": 0.5, "technical": -0.2, "sales": 0.1}


def log_softmax(values):
    total = math.log(sum(math.exp(v) for v in values))
    return [v - total for v in values]


class LeaningBackend(DecisionBackend):
    """Scores each option by its position's prior, plus its evidence unless the input is neutral."""

    name = "leaning"
    render_version = "leaning-1"

    def __init__(self) -> None:
        super().__init__(host=None)  # type: ignore[arg-type]
        self.states: list[str] = []

    async def read(self, question, context) -> Reading:
        state = context.state
        self.states.append(state)
        neutral = state in NEUTRAL_INPUTS
        scores = [
            PRIOR[i] + (0.0 if neutral else EVIDENCE[o.value])
            for i, o in enumerate(question.options)
        ]
        return one_read(scores)


def choice(order):
    return CHOICE.compile(
        ChoiceQuestion(instructions="Which team?", criteria={k: None for k in order})
    )


async def test_a_known_prior_is_removed_exactly_and_read_once_per_question():
    backend, cache = LeaningBackend(), PriorCache(16)
    correction = Correction("content-free", cache)
    question = choice(["sales", "billing", "technical"])
    first = await read_question(
        backend, question, ReadContext.about("ticket", "r", None), NO_DEBIAS, correction
    )
    evidence = log_softmax([EVIDENCE[k] for k in ("sales", "billing", "technical")])
    assert log_softmax(list(first.prior.adjusted_logits.values())) == pytest.approx(
        evidence, abs=1e-9
    )
    assert first.prior.cached is False and first.prior.mode == "content-free"
    # option_logits stay the raw reading: the prior is still in it.
    assert first.reading.scores == pytest.approx(
        [PRIOR[0] + 0.1, PRIOR[1] + 0.5, PRIOR[2] - 0.2]
    )
    assert backend.states.count("ticket") == 1 and len(backend.states) == 1 + len(
        NEUTRAL_INPUTS
    )
    again = await read_question(
        backend,
        question,
        ReadContext.about("another ticket", "r2", None),
        NO_DEBIAS,
        correction,
    )
    assert again.prior.cached is True and len(backend.states) == 2 + len(NEUTRAL_INPUTS)


async def test_each_rotation_subtracts_its_own_prior():
    backend, correction = LeaningBackend(), Correction("content-free", PriorCache(16))
    read = await read_question(
        backend,
        choice(["sales", "billing", "technical"]),
        ReadContext.about("s", "r", None),
        parse_debias("rotate:3"),
        correction,
    )
    keys = ['"sales"', '"billing"', '"technical"']
    truth = dict(zip(keys, log_softmax([0.1, 0.5, -0.2]), strict=True))
    got = read.prior.adjusted_logits
    assert dict(
        zip(keys, log_softmax([got[k] for k in keys]), strict=True)
    ) == pytest.approx(truth, abs=1e-9)


async def test_a_failed_prior_read_is_not_cached():
    cache = PriorCache(4)

    async def failing():
        raise RuntimeError("engine gone")

    async def working():
        return [0.0, -1.0]

    with pytest.raises(RuntimeError):
        await cache.get("q", failing)
    assert (await cache.get("q", working)).cached is False
    assert (await cache.get("q", working)).cached is True


def test_a_fitted_bias_applies_by_the_position_each_option_had():
    rows = [[-1.0, -0.5], [-0.7, -0.7]]
    positions = [[0, 1], [1, 0]]
    assert adjusted(rows, positions, None, [0.0, 2.0]) == pytest.approx(
        [(-1.0 - 0.7 + 2.0) / 2, (1.5 - 0.7) / 2]
    )


def samples(lean: float, signal: float, count: int, seed: int = 0) -> list[Sample]:
    """Yes/no questions read in one order: position 0 gets ``lean`` whatever the truth, the correct
    option ``signal``."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        correct = rng.randrange(2)
        scores = [lean + rng.gauss(0, 0.3), rng.gauss(0, 0.3)]
        scores[correct] += signal
        out.append(Sample([log_softmax(scores)], [[0, 1]], None, correct, f"g{i}"))
    return out


def test_the_fit_recovers_a_position_lean():
    # Position 0 leans by 2: the bias gives position 1 the same (position 0 is fixed at 0).
    temperature, bias = fit(samples(2.0, 1.0, 400), "fitted", 2)
    assert bias[0] == 0.0 and bias[1] == pytest.approx(2.0, abs=0.2)
    # The evidence (1.0 against noise of 0.3) is sharper than the raw scores say: T below 1.
    assert 0 < temperature < 1


def test_the_choice_keeps_a_fitted_bias_that_helps_and_refuses_one_that_does_not():
    leaning = choose(samples(2.0, 1.0, 200))
    assert leaning.mode == "fitted"
    assert leaning.candidates["fitted"].accuracy > leaning.candidates["off"].accuracy
    # No lean to remove: a fitted bias only adds noise, and the uncorrected reading stays.
    assert choose(samples(0.0, 1.0, 200, seed=1)).mode == "off"
    # Content-free modes need content-free reads: without them they are not candidates.
    assert set(leaning.candidates) == {"off", "fitted"}


def test_the_bias_learns_the_models_lean_not_the_sets_answer_mix():
    # No lean at all, but 80% of the answers sit at position 1: a bias toward position 1 would only
    # teach the server this set's mix, so the fit weights each answer position alike.
    rng = random.Random(3)
    skewed = []
    for i in range(400):
        correct = 1 if rng.random() < 0.8 else 0
        scores = [rng.gauss(0, 1.0), rng.gauss(0, 1.0)]
        scores[correct] += (
            0.5  # weak evidence: fitted unweighted, the bias would take the mix (about 2.2)
        )
        skewed.append(Sample([log_softmax(scores)], [[0, 1]], None, correct, f"g{i}"))
    _, bias = fit(skewed, "fitted", 2)
    assert bias[1] == pytest.approx(0.0, abs=0.15)


def test_a_gain_within_the_noise_is_not_kept():
    # A lean too small for 60 questions to show: held-out log loss may dip by chance, but the
    # interval of the gain straddles zero and the uncorrected reading stays.
    choice = choose(samples(0.05, 1.0, 60, seed=4))
    assert choice.mode == "off"
    low, high = choice.candidates["fitted"].gain
    assert low <= 0 <= high or high < 0


async def test_the_cache_is_bounded_in_bytes_and_a_long_question_costs_no_more():
    from vllm.entrypoints.generate.decisions.decide.reading.prior import (
        entry_bytes,
    )

    async def three() -> list[float]:
        return [0.0, -1.0, -2.0]

    cache = PriorCache(4096, max_bytes=entry_bytes(3) * 2)
    long_key = "x" * 1_600_000  # a 1.6 MB question's fingerprint is kept as its digest
    await cache.get(long_key, three)
    assert cache.bytes == entry_bytes(3) and len(cache) == 1
    await cache.get("short", three)
    assert cache.bytes == entry_bytes(3) * 2 and len(cache) == 2
    await cache.get("third", three)  # over the bytes: the least recently used goes
    assert cache.bytes <= cache.max_bytes and len(cache) == 2
    assert (await cache.get("third", three)).cached and (
        await cache.get("short", three)
    ).cached
    assert not (await cache.get(long_key, three)).cached
