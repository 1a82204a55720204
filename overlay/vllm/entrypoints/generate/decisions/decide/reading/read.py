# SPDX-License-Identifier: Apache-2.0
"""One question's read: :func:`plan_read` resolves it before anything goes to the engine, and
:func:`read` runs it, every order and content-free read in one batch sharing the state's prefix."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
)
from vllm.entrypoints.generate.decisions.decide.concurrency import gather_or_cancel
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import (
    Example,
    ReadContext,
)
from vllm.entrypoints.generate.decisions.decide.reading.calls import (
    backend_read,
    checked_scores,
)
from vllm.entrypoints.generate.decisions.decide.reading.prior import PriorRead
from vllm.entrypoints.generate.decisions.decide.reading.prior_reads import (
    NO_CORRECTION,
    Correction,
    corrected,
    prior_read,
)
from vllm.entrypoints.generate.decisions.decide.reading.rotation import (
    combined,
    in_client_order,
    orders,
    reordered,
)
from vllm.entrypoints.generate.decisions.decide.reports import (
    AbstentionReport,
    DebiasAudit,
    ExamplesAudit,
    PriorAudit,
    QuestionMapAudit,
)
from vllm.entrypoints.generate.decisions.decide.scoring import log_softmax
from vllm.entrypoints.generate.decisions.decide.settings import (
    Debias,
    uses_content_free,
)
from vllm.entrypoints.generate.decisions.decide.temperature import DEFAULT, Temperature


@dataclass(frozen=True)
class ReadPlan:
    """How one question is read; ``context`` has the label layout laid over the backend's options."""

    backend: DecisionBackend
    question: CompiledQuestion
    context: ReadContext[Any]
    debias: Debias
    orders: list[list[int]]
    correction: Correction = NO_CORRECTION
    temperature: Temperature = DEFAULT
    # The question's own map's bias in logit units, added here (its scale is the temperature).
    map_bias: Sequence[float] | None = None

    @property
    def rotated(self) -> bool:
        return self.debias.mode != "off" and not self.backend.order_independent

    @property
    def content_free(self) -> bool:
        return (
            uses_content_free(self.correction.mode)
            and self.correction.cache is not None
        )

    def prior_reads(self) -> list[Awaitable[PriorRead]]:
        return [
            prior_read(
                self.backend,
                reordered(self.question, order),
                self.context.part(f"p{i}"),
                self.correction,
            )
            for i, order in enumerate(self.orders)
        ]


@dataclass(frozen=True)
class Resolved:
    """How one question is read, as the settings and the calibration in force resolved it
    (``layout`` None: as the request has it), and what its answer reports of them."""

    correction: Correction = NO_CORRECTION
    layout: str | None = None
    temperature: Temperature = DEFAULT
    # A question's own map adds this bias (logit units) to the scores T divides.
    map_bias: Sequence[float] | None = None
    # Kept in-context examples, shown ahead of the input.
    examples: tuple[Example, ...] = ()
    question_map: QuestionMapAudit | None = None
    examples_audit: ExamplesAudit | None = None
    abstention: Callable[[float], AbstentionReport] | None = None


AS_SENT = Resolved()


def plan_read(
    backend: DecisionBackend,
    question: CompiledQuestion,
    context: ReadContext[Any],
    debias: Debias,
    how: Resolved = AS_SENT,
) -> ReadPlan:
    if how.examples:
        context = context.with_examples(how.examples)
    return ReadPlan(
        backend,
        question,
        context.with_options(backend.with_layout(context.options, how.layout)),
        debias,
        orders(question, debias, backend.order_independent),
        how.correction,
        how.temperature,
        how.map_bias,
    )


@dataclass
class QuestionRead:
    """A question's read in client option order: per order, ``rows`` (log-probabilities),
    ``positions`` (each option's place) and ``priors`` (content-free, when read); ``corrected``: the
    scores with the correction and the question map's bias. :attr:`scores` are what T divides."""

    reading: Reading
    raw: list[float]
    debias: DebiasAudit | None
    rows: list[list[float]]
    positions: list[list[int]]
    priors: list[list[float]] | None = None
    prior: PriorAudit | None = None
    corrected: list[float] | None = None

    @property
    def scores(self) -> list[float]:
        return self.corrected if self.corrected is not None else self.raw


async def read(plan: ReadPlan) -> QuestionRead:
    """``plan`` run: its orders read (with the content-free reads), combined and corrected."""
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
        reads += plan.prior_reads()
    results = await gather_or_cancel(reads)
    readings: list[Reading] = list(results[: len(plan.orders)])
    per_order = [
        in_client_order(
            checked_scores(reading, len(question.options), backend.name), order
        )
        for reading, order in zip(readings, plan.orders, strict=True)
    ]
    rows = [log_softmax(row) for row in per_order]
    reading, raw, audit = readings[0], per_order[0], None
    if plan.rotated:
        reading, audit = combined(question, plan.debias, plan.orders, readings, rows)
        raw = list(reading.scores)
    positions = [in_client_order(range(len(order)), order) for order in plan.orders]
    done = QuestionRead(reading, raw, audit, rows, positions)
    priors = list(results[len(plan.orders) :]) if plan.content_free else None
    return with_correction(plan, done, priors)


async def with_content_free(plan: ReadPlan, done: QuestionRead) -> QuestionRead:
    """``done`` as :func:`read` would have given it with the content-free reads (calibration)."""
    assert plan.correction.cache is not None
    priors = await gather_or_cancel(plan.prior_reads())
    return with_correction(plan, replace(done), list(priors))


def with_correction(
    plan: ReadPlan, done: QuestionRead, priors: list[PriorRead] | None
) -> QuestionRead:
    """``done`` with its content-free reads (None: not read) and the plan's correction applied."""
    if priors is not None:
        done.priors = [
            in_client_order(p.logprobs, order)
            for p, order in zip(priors, plan.orders, strict=True)
        ]
    if plan.correction.mode != "off":
        done.corrected, done.prior = corrected(
            plan.question,
            done.rows,
            done.positions,
            done.priors,
            plan.correction,
            all(p.cached for p in priors) if priors else None,
        )
    if plan.map_bias is not None:
        # softmax(scale * s + bias) as the temperature 1 / scale divides it: the bias in score units.
        temperature = plan.temperature.value
        done.corrected = [
            score + bias * temperature
            for score, bias in zip(done.scores, plan.map_bias, strict=True)
        ]
    return done
