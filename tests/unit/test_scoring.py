from __future__ import annotations

import math

import pytest

from vllm.entrypoints.generate.decisions.decide.scoring import (
    confidence,
    non_finite,
    softmax,
)


def test_softmax_with_temperature():
    probs = softmax([math.log(3), 0.0], temperature=1.0)
    assert probs == pytest.approx([0.75, 0.25])
    flatter = softmax([math.log(3), 0.0], temperature=2.0)
    assert flatter[0] == pytest.approx(math.sqrt(3) / (math.sqrt(3) + 1))


def test_softmax_handles_minus_infinity():
    assert softmax([0.0, -math.inf]) == [1.0, 0.0]
    assert softmax([-math.inf, -math.inf]) == [0.5, 0.5]


def test_confidence_is_normalized_peak():
    assert confidence([0.5, 0.5]) == 0.0
    assert confidence([1.0, 0.0, 0.0]) == 1.0
    assert confidence([0.87, 0.13]) == pytest.approx((2 * 0.87 - 1) / 1)
    assert confidence([0.5, 0.25, 0.25]) == pytest.approx((3 * 0.5 - 1) / 2)


@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 1e-6, 1e6, 1e308])
@pytest.mark.parametrize(
    "scores",
    [[0.0, -1.0], [-1e300, 1e300], [1e308, -1e308, 0.0], [-3.0, -math.inf, -3.0]],
)
def test_softmax_is_a_distribution_for_any_positive_temperature(scores, temperature):
    """Dividing before subtracting the top score made ``inf - inf`` = NaN for a denormal T (sent as null)."""
    probs = softmax(scores, temperature)
    assert all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in probs) and math.fsum(
        probs
    ) == pytest.approx(1.0)
    assert probs.index(max(probs)) == scores.index(max(scores))
    assert non_finite({"probabilities": probs, "confidence": confidence(probs)}) is None


def test_non_finite_names_where():
    assert non_finite({"probability": 0.5, "levels": [0.1, {"x": 2}]}) is None
    assert (
        non_finite({"probability": 0.5, "levels": [0.1, {"x": math.nan}]})
        == ".levels[1].x"
    )
    assert non_finite({"score": -math.inf}) == ".score"
    assert non_finite(math.inf) == "the value"
