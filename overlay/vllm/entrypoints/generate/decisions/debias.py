# SPDX-License-Identifier: Apache-2.0
"""Answers that don't depend on the order a client listed the options in.

A model reading lettered options favours some positions and letters over others, whatever the
evidence. With ``rotate`` the options of an unordered question (choice, yes/no, plugin types) are
first put in a canonical order (sorted by the text the prompt shows), so the client's order can't
matter; the question is then read under N cyclic rotations of that order, each option in a different
position, all reads submitted together so they share the state's prefix-cache blocks. An ordered
question (a score's levels) keeps its scale: its second reading lists the levels reversed.

The readings are combined by averaging each option's log-probability over the readings (each
reading normalised over the options first). If a position adds the same bias to whichever option
sits there, a full cycle cancels that bias exactly, and fewer rotations spread it evenly; the mean
of log-probabilities is a product of the readings, so an option only wins if it is likely in every
order; and the result stays a log-probability, so the calibration temperature applies unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from .backends.base import DecisionBackend, Reading, checked_scores
from .concurrency import gather_or_cancel
from .errors import DecisionError
from .questions import CompiledQuestion, top_index
from .scoring import log_softmax
from .settings import Debias

# Readings of ``rotate`` without a count: two for every type (a yes/no both ways, a score forwards and
# reversed, a choice from two starts half a cycle apart), so its cost is the same for every question.
DEFAULT_ROTATIONS = 2


class Rotation(BaseModel):
    """One reading of a debiased question: the option it listed first, whether it reversed a scale,
    and the option it put on top."""

    first: str
    reversed: bool
    top: str


class DebiasAudit(BaseModel):
    """What a debiased answer's ``extra.audit`` says about its readings."""

    debias: str
    rotations: list[Rotation]
    # The share of readings whose top option is the combined answer's.
    rotation_agreement: float


@dataclass
class DebiasedReading:
    """A question's reading in the client's option order; ``debias`` is None for a single read."""

    reading: Reading
    debias: DebiasAudit | None = None


def orders(question: CompiledQuestion, debias: Debias) -> list[list[int]]:
    """The option orders to read, each a list of indices into ``question.options`` in prompt order."""
    count = len(question.options)
    if debias.mode == "off":
        return [list(range(count))]
    if question.qtype.ordered:
        forward = list(range(count))
        return [forward] if debias.rotations == 1 else [forward, forward[::-1]]
    # By what the prompt shows, so options that render alike on both wires (a boolean false and the
    # string "false") land in the same place; the key only breaks ties between identical texts.
    canonical = sorted(range(count), key=lambda i: (question.options[i].text, question.options[i].key))
    wanted = min(count, debias.rotations or DEFAULT_ROTATIONS)
    shifts = sorted({round(j * count / wanted) for j in range(wanted)})
    return [canonical[s:] + canonical[:s] for s in shifts]


async def read_question(backend: DecisionBackend, state: str, question: CompiledQuestion, request_id: str,
                        options: Any, debias: Debias) -> DebiasedReading:  # fmt: skip
    """The backend's reading of ``question``, debiased as asked; scores in the client's option order."""
    if debias.mode == "off":
        return DebiasedReading(await backend.read(state, question, request_id, options))
    plan = orders(question, debias)
    reads = [
        backend.read(state, reordered(question, order), f"{request_id}-r{i}" if len(plan) > 1 else request_id, options)
        for i, order in enumerate(plan)
    ]
    readings = await gather_or_cancel(reads)
    per_order = [
        in_client_order(checked_scores(reading, len(question.options), backend.name), order)
        for reading, order in zip(readings, plan, strict=True)
    ]
    return combined(question, debias, plan, readings, per_order)


def reordered(question: CompiledQuestion, order: Sequence[int]) -> CompiledQuestion:
    return replace(question, options=tuple(question.options[i] for i in order))


def in_client_order(scores: Sequence[float], order: Sequence[int]) -> list[float]:
    """Scores read in ``order`` back at the options' positions in the question as sent."""
    back = [0.0] * len(order)
    for position, index in enumerate(order):
        back[index] = scores[position]
    return back


def combined(question: CompiledQuestion, debias: Debias, plan: list[list[int]], readings: Sequence[Reading],
             per_order: list[list[float]]) -> DebiasedReading:  # fmt: skip
    rows = [log_softmax(scores) for scores in per_order]
    scores = [sum(column) / len(rows) for column in zip(*rows, strict=True)]
    if all(s == -math.inf for s in scores):
        raise DecisionError("the rotations of this question agree on no option (each gives the others zero)")
    keys = [o.key for o in question.options]
    tops = [keys[top_index(row)] for row in rows]
    winner = keys[top_index(scores)]
    masses = [r.option_mass for r in readings if r.option_mass is not None]
    first = readings[0]
    rotations = [
        Rotation(first=keys[order[0]], reversed=question.qtype.ordered and i > 0, top=top)
        for i, (order, top) in enumerate(zip(plan, tops, strict=True))
    ]
    audit = DebiasAudit(
        debias=str(debias),
        rotations=rotations,
        rotation_agreement=sum(top == winner for top in tops) / len(tops),
    )
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
    return DebiasedReading(reading, audit)
