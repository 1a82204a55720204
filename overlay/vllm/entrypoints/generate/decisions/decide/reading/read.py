# SPDX-License-Identifier: Apache-2.0
"""One question's read, planned once and run by :func:`read`.

:func:`plan_read` resolves how the question is read before anything goes to the engine: the label
layout over the backend's options, the option orders (one, or the rotations ``debias`` asks for),
the prior correction and the temperature its answer gets. :func:`read` runs the plan in three steps:
every order read together with the content-free reads the correction needs (one batch, sharing the
state's prefix), the orders combined (rotation.py), the correction applied (prior_reads.py) and the
question's own bias where it has a map. It returns the scores the temperature divides."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from typing import Any

from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
)
from vllm.entrypoints.generate.decisions.decide.calibration.question_map import (
    QuestionMap,
)
from vllm.entrypoints.generate.decisions.decide.concurrency import gather_or_cancel
from vllm.entrypoints.generate.decisions.decide.prior_modes import (
    uses_content_free,
)
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.calls import (
    backend_read,
    checked_scores,
)
from vllm.entrypoints.generate.decisions.decide.reading.prior import (
    PriorRead,
)
from vllm.entrypoints.generate.decisions.decide.reading.prior_reads import (
    NO_CORRECTION,
    Correction,
    corrected,
    in_client_priors,
    prior_reads,
)
from vllm.entrypoints.generate.decisions.decide.reading.rotation import (
    combined,
    in_client_order,
    orders,
    reordered,
)
from vllm.entrypoints.generate.decisions.decide.reports import DebiasAudit, PriorAudit
from vllm.entrypoints.generate.decisions.decide.scoring import log_softmax
from vllm.entrypoints.generate.decisions.decide.settings import Debias
from vllm.entrypoints.generate.decisions.decide.temperature import (
    DEFAULT,
    Temperature,
)


@dataclass(frozen=True)
class ReadPlan:
    """How one question is read, resolved before any read: its context (the label layout laid over
    the backend's options), the option orders to read (prompt order, as indices into the question's
    options), the ``debias`` setting they come from, the prior correction and the temperature."""

    backend: DecisionBackend
    question: CompiledQuestion
    context: ReadContext[Any]
    debias: Debias
    orders: list[list[int]]
    correction: Correction = NO_CORRECTION
    temperature: Temperature = DEFAULT
    # The question's own map (its scale is the temperature; its bias is added here).
    question_map: QuestionMap | None = None

    @property
    def rotated(self) -> bool:
        """Whether the orders are rotations to combine (else one read, taken as it is)."""
        return self.debias.mode != "off" and not self.backend.order_independent

    @property
    def content_free(self) -> bool:
        """Whether the correction needs content-free reads (and has a cache for them)."""
        return (
            uses_content_free(self.correction.mode)
            and self.correction.cache is not None
        )


def plan_read(
    backend: DecisionBackend,
    question: CompiledQuestion,
    context: ReadContext[Any],
    debias: Debias,
    correction: Correction = NO_CORRECTION,
    layout: str | None = None,
    temperature: Temperature = DEFAULT,
    question_map: QuestionMap | None = None,
) -> ReadPlan:
    """The plan for reading ``question`` under ``context`` in ``layout`` (None: the options as the
    context has them)."""
    return ReadPlan(
        backend,
        question,
        context.with_options(backend.with_layout(context.options, layout)),
        debias,
        orders(question, debias, backend.order_independent),
        correction,
        temperature,
        question_map,
    )


@dataclass
class QuestionRead:
    """A question's read in the client's option order; ``debias`` is None for a single read.

    ``rows`` are each order's log-probabilities and ``positions`` the position each option had in it
    (client order); ``priors`` each order's content-free log-probabilities, when read; ``prior`` the
    correction applied, and ``corrected`` its scores (with the question's own bias, where it has a
    map). :attr:`scores` are what the temperature divides.
    """

    reading: Reading
    raw: list[float]
    debias: DebiasAudit | None = None
    rows: list[list[float]] = field(default_factory=list)
    positions: list[list[int]] = field(default_factory=list)
    priors: list[list[float]] | None = None
    prior: PriorAudit | None = None
    corrected: list[float] | None = None

    @property
    def scores(self) -> list[float]:
        return self.corrected if self.corrected is not None else self.raw


async def read(plan: ReadPlan) -> QuestionRead:
    """``plan`` run: its orders read (with the content-free reads not yet cached, one batch),
    combined, and corrected; scores in the client's option order."""
    backend, question, context = plan.backend, plan.question, plan.context
    several = len(plan.orders) > 1
    reads: list[Awaitable[Any]] = [
        backend_read(
            backend,
            reordered(question, order),
            context.part(f"r{i}") if several else context,
        )
        for i, order in enumerate(plan.orders)
    ]
    if plan.content_free:
        reads += prior_reads(backend, question, context, plan.orders, plan.correction)
    results = await gather_or_cancel(reads)
    readings: list[Reading] = list(results[: len(plan.orders)])
    per_order = [
        in_client_order(
            checked_scores(reading, len(question.options), backend.name), order
        )
        for reading, order in zip(readings, plan.orders, strict=True)
    ]
    rows = [log_softmax(row) for row in per_order]
    if plan.rotated:
        reading, audit = combined(question, plan.debias, plan.orders, readings, rows)
        done = QuestionRead(reading, list(reading.scores), audit)
    else:
        done = QuestionRead(readings[0], per_order[0])
    done.rows = rows
    done.positions = [
        in_client_order(range(len(order)), order) for order in plan.orders
    ]
    priors = list(results[len(plan.orders) :]) if plan.content_free else None
    return with_correction(plan, done, priors)


async def with_content_free(plan: ReadPlan, done: QuestionRead) -> QuestionRead:
    """``done`` (read without content-free reads) with them, as :func:`read` would have given it:
    only the content-free reads go to the engine (calibration's full pass adds them to its first
    pass's reads)."""
    assert plan.correction.cache is not None
    priors = await gather_or_cancel(
        prior_reads(
            plan.backend, plan.question, plan.context, plan.orders, plan.correction
        )
    )
    return with_correction(plan, replace(done), list(priors))


def with_correction(
    plan: ReadPlan, done: QuestionRead, priors: list[PriorRead] | None
) -> QuestionRead:
    """``done`` with its content-free reads (``priors``, None when not read) and the plan's
    correction applied."""
    if priors is not None:
        done.priors = in_client_priors(priors, plan.orders)
    if plan.correction.mode != "off":
        done.corrected, done.prior = corrected(
            plan.question,
            done.rows,
            done.positions,
            done.priors,
            plan.correction,
            all(p.cached for p in priors) if priors else None,
        )
    if plan.question_map is not None:
        # softmax(scale * s + bias) as the temperature 1 / scale divides it: the bias in score units.
        temperature = plan.temperature.value
        done.corrected = [
            score + bias * temperature
            for score, bias in zip(done.scores, plan.question_map.bias, strict=True)
        ]
    return done
