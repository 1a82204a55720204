from __future__ import annotations

import math

import pytest

from vllm.entrypoints.generate.decisions.scoring import confidence, softmax


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
