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
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
    backend_read,
    checked_scores,
)
from vllm.entrypoints.generate.decisions.decide.concurrency import gather_or_cancel
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.questions import (
    CompiledQuestion,
    top_index,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.prior import (
    NEUTRAL_INPUTS,
    PriorCache,
    PriorRead,
    adjusted,
    fingerprint,
    mean_log_probabilities,
    uses_content_free,
    uses_fitted,
)
from vllm.entrypoints.generate.decisions.decide.reading.scoring import log_softmax
from vllm.entrypoints.generate.decisions.decide.reports import (
    DebiasAudit,
    PriorAudit,
    Rotation,
)
from vllm.entrypoints.generate.decisions.decide.settings import Debias

T = TypeVar("T")

# Readings of ``rotate`` without a count: two for every type (a yes/no both ways, a score forwards and
# reversed, a choice from two starts half a cycle apart), so its cost is the same for every question.
DEFAULT_ROTATIONS = 2


@dataclass(frozen=True)
class Correction:
    """The prior correction a read asks for (prior.py): the mode, the cache of content-free reads
    (needed by the content-free modes) and the fitted bias per position (None: none fitted)."""

    mode: str = "off"
    cache: PriorCache | None = None
    bias: list[float] | None = None


NO_CORRECTION = Correction()


@dataclass
class DebiasedReading:
    """A question's reading in the client's option order; ``debias`` is None for a single read.

    ``rows`` are each reading's log-probabilities and ``positions`` the position each option had in it
    (client order); ``priors`` each reading's content-free log-probabilities, when read; ``prior`` the
    correction applied, and ``corrected`` the scores the temperature divides when one was applied.
    """

    reading: Reading
    debias: DebiasAudit | None = None
    rows: list[list[float]] = field(default_factory=list)
    positions: list[list[int]] = field(default_factory=list)
    priors: list[list[float]] | None = None
    prior: PriorAudit | None = None
    corrected: list[float] | None = None


def orders(
    question: CompiledQuestion, debias: Debias, order_independent: bool = False
) -> list[list[int]]:
    """The option orders to read, each a list of indices into ``question.options`` in prompt order; one,
    the client's, for a backend whose readings don't depend on the order."""
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


async def read_question(
    backend: DecisionBackend,
    question: CompiledQuestion,
    context: ReadContext[Any],
    debias: Debias,
    correction: Correction = NO_CORRECTION,
) -> DebiasedReading:
    """The backend's reading of ``question`` under ``context``, debiased and corrected as asked; scores in
    the client's option order. Content-free reads not yet cached go to the engine with the real ones."""
    plan = orders(question, debias, backend.order_independent)
    several = len(plan) > 1
    reads: list[Awaitable[Any]] = [
        backend_read(
            backend,
            reordered(question, order),
            context.part(f"r{i}") if several else context,
        )
        for i, order in enumerate(plan)
    ]
    content_free = uses_content_free(correction.mode) and correction.cache is not None
    if content_free:
        reads += prior_reads(backend, question, context, plan, correction)
    results = await gather_or_cancel(reads)
    readings: list[Reading] = list(results[: len(plan)])
    per_order = [
        in_client_order(
            checked_scores(reading, len(question.options), backend.name), order
        )
        for reading, order in zip(readings, plan, strict=True)
    ]
    rows = [log_softmax(row) for row in per_order]
    single = debias.mode == "off" or backend.order_independent
    read = (
        DebiasedReading(readings[0])
        if single
        else combined(question, debias, plan, readings, rows)
    )
    read.rows = rows
    read.positions = [in_client_order(range(len(order)), order) for order in plan]
    priors = list(results[len(plan) :]) if content_free else None
    return corrected_reading(question, read, plan, priors, correction)


async def with_content_free(
    backend: DecisionBackend,
    question: CompiledQuestion,
    context: ReadContext[Any],
    debias: Debias,
    correction: Correction,
    read: DebiasedReading,
) -> DebiasedReading:
    """``read`` (made without content-free reads) with them, as :func:`read_question` under
    ``correction`` would have given it: only the content-free reads go to the engine (calibration's
    full pass adds them to its first pass's reads)."""
    assert correction.cache is not None
    plan = orders(question, debias, backend.order_independent)
    priors = await gather_or_cancel(
        prior_reads(backend, question, context, plan, correction)
    )
    return corrected_reading(question, replace(read), plan, list(priors), correction)


def prior_reads(
    backend: DecisionBackend,
    question: CompiledQuestion,
    context: ReadContext[Any],
    plan: list[list[int]],
    correction: Correction,
) -> list[Awaitable[PriorRead]]:
    """The content-free reads of ``question`` in each order of ``plan``."""
    return [
        prior_read(
            backend, reordered(question, order), context.part(f"p{i}"), correction
        )
        for i, order in enumerate(plan)
    ]


def corrected_reading(
    question: CompiledQuestion,
    read: DebiasedReading,
    plan: list[list[int]],
    priors: list[PriorRead] | None,
    correction: Correction,
) -> DebiasedReading:
    """``read`` with its content-free reads (``priors``, None when not read) and ``correction`` applied."""
    if priors is not None:
        read.priors = [
            in_client_order(p.logprobs, order)
            for p, order in zip(priors, plan, strict=True)
        ]
    if correction.mode != "off":
        fitted = correction.bias if uses_fitted(correction.mode) else None
        read.corrected = adjusted(read.rows, read.positions, read.priors, fitted)
        read.prior = prior_audit(
            question,
            read,
            correction.mode,
            fitted,
            all(p.cached for p in priors) if priors else None,
        )
    return read


async def prior_read(
    backend: DecisionBackend,
    question: CompiledQuestion,
    context: ReadContext[Any],
    correction: Correction,
) -> PriorRead:
    """``question``'s content-free log-probabilities in the order given, from the cache or read now (about
    each neutral input in place of ``context``'s state)."""
    assert correction.cache is not None
    key = fingerprint(
        backend.name,
        backend.render_version,
        context.options,
        question.qtype.name,
        question.instructions,
        [o.text for o in question.options],
    )

    async def neutral() -> list[float]:
        reads = [
            backend_read(
                backend, question, context.with_state(text, f"{context.request_id}-{i}")
            )
            for i, text in enumerate(NEUTRAL_INPUTS)
        ]
        readings = await gather_or_cancel(reads)
        return mean_log_probabilities(
            [checked_scores(r, len(question.options), backend.name) for r in readings]
        )

    return await correction.cache.get(key, neutral)


def prior_audit(
    question: CompiledQuestion,
    read: DebiasedReading,
    mode: str,
    fitted: list[float] | None,
    cached: bool | None,
) -> PriorAudit:
    keys = [o.key for o in question.options]
    scores = read.corrected or []
    bias = None
    if fitted is not None:
        zero = [[0.0] * len(keys) for _ in read.rows]
        bias = dict(
            zip(keys, adjusted(zero, read.positions, None, fitted), strict=True)
        )
    content_free = None
    if read.priors is not None:
        content_free = {
            k: sum(p[i] for p in read.priors) / len(read.priors)
            for i, k in enumerate(keys)
        }
    return PriorAudit(
        mode=mode,
        content_free=content_free,
        cached=cached,
        bias=bias,
        adjusted_logits=dict(zip(keys, scores, strict=True)),
    )


def reordered(question: CompiledQuestion, order: Sequence[int]) -> CompiledQuestion:
    return replace(question, options=tuple(question.options[i] for i in order))


def in_client_order(values: Sequence[T], order: Sequence[int]) -> list[T]:
    """Values read in ``order`` (scores, or the positions themselves) back at the options' positions
    in the question as sent."""
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
) -> DebiasedReading:
    """The readings averaged; ``rows`` are their log-probabilities in the client's option order."""
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
