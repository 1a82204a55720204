# SPDX-License-Identifier: Apache-2.0
"""Option rotation (``debias``): answers independent of the order the client listed the options in.

Unordered questions are read in a canonical order and its cyclic rotations (an ordered one forwards
and reversed), together so they share the prefix cache. Averaging log-probabilities cancels a
per-position bias over a full cycle, lets an option win only if likely in every order, and stays a
log-probability, so the temperature applies unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

from vllm.entrypoints.generate.decisions.decide.backends.base import Reading
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.questions import (
    CompiledQuestion,
    top_index,
)
from vllm.entrypoints.generate.decisions.decide.reports import DebiasAudit, Rotation
from vllm.entrypoints.generate.decisions.decide.settings import Debias

T = TypeVar("T")

# Readings of ``rotate`` without a count: two for every type (a yes/no both ways, a score forwards and
# reversed, a choice from two starts half a cycle apart), so its cost is the same for every question.
DEFAULT_ROTATIONS = 2


def orders(
    question: CompiledQuestion, debias: Debias, order_independent: bool = False
) -> list[list[int]]:
    """The option orders to read, as indices into ``question.options`` in prompt order."""
    count = len(question.options)
    if debias.mode == "off" or order_independent:
        return [list(range(count))]
    if question.qtype.ordered:
        forward = list(range(count))
        return [forward] if debias.rotations == 1 else [forward, forward[::-1]]
    # By what the prompt shows, so options that render alike on both wires (a boolean false and the
    # string "false") land in the same place; the key only breaks ties between identical texts.
    canonical = sorted(
        range(count), key=lambda i: (question.options[i].text, question.options[i].key)
    )
    wanted = min(count, debias.rotations or DEFAULT_ROTATIONS)
    shifts = sorted({round(j * count / wanted) for j in range(wanted)})
    return [canonical[s:] + canonical[:s] for s in shifts]


def reordered(question: CompiledQuestion, order: Sequence[int]) -> CompiledQuestion:
    return replace(question, options=tuple(question.options[i] for i in order))


def in_client_order(values: Sequence[T], order: Sequence[int]) -> list[T]:
    """Values read in ``order`` back at the options' positions as sent."""
    back: list[T] = list(values)
    for position, index in enumerate(order):
        back[index] = values[position]
    return back


def combined(
    question: CompiledQuestion,
    debias: Debias,
    plan: list[list[int]],
    readings: Sequence[Reading],
    rows: list[list[float]],
) -> tuple[Reading, DebiasAudit]:
    """The readings averaged, and their audit; ``rows``: log-probabilities in client order."""
    scores = [sum(column) / len(rows) for column in zip(*rows, strict=True)]
    if all(s == -math.inf for s in scores):
        raise DecisionError(
            "the rotations of this question agree on no option (each gives the others zero)"
        )
    keys = [o.key for o in question.options]
    tops = [keys[top_index(row)] for row in rows]
    winner = keys[top_index(scores)]
    masses = [r.option_mass for r in readings if r.option_mass is not None]
    first = readings[0]
    rotations = [
        Rotation(
            first=keys[order[0]], reversed=question.qtype.ordered and i > 0, top=top
        )
        for i, (order, top) in enumerate(zip(plan, tops, strict=True))
    ]
    reading = Reading(
        scores=scores,
        forward_passes=sum(r.forward_passes for r in readings),
        input_tokens=sum(r.input_tokens for r in readings),
        cached_input_tokens=sum(r.cached_input_tokens for r in readings),
        readout=first.readout,
        option_mass=sum(masses) / len(masses) if masses else None,
        meta=first.meta,
        audit=first.audit,
    )
    return reading, DebiasAudit(
        debias=str(debias),
        rotations=rotations,
        rotation_agreement=sum(top == winner for top in tops) / len(tops),
    )
