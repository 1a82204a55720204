# SPDX-License-Identifier: Apache-2.0
"""What the decision service returns. Imports nothing of the package at run time, so any module can
read answers without depending on the service that makes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
    from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
    from vllm.entrypoints.generate.decisions.decide.reports import (
        AbstentionReport,
        AuditRecord,
        BackendReport,
    )


@dataclass
class Answer:
    question: CompiledQuestion
    probabilities: list[float]
    confidence: float
    fields: dict[str, Any]
    backend: BackendReport
    audit: AuditRecord
    input_tokens: int
    cached_tokens: int
    # Set where the operator asked its type for a precision.
    abstention: AbstentionReport | None = None


@dataclass
class Failure:
    question: CompiledQuestion
    error: DecisionError


@dataclass
class Decision:
    served_model: str
    results: list[Answer | Failure] = field(default_factory=list)

    @property
    def input_tokens(self) -> int:
        return sum(r.input_tokens for r in self.results if isinstance(r, Answer))

    @property
    def cached_tokens(self) -> int:
        return sum(r.cached_tokens for r in self.results if isinstance(r, Answer))

    def first_failure(self) -> DecisionError | None:
        """The first failure, when no question was answered."""
        if any(isinstance(r, Answer) for r in self.results):
            return None
        return next(r.error for r in self.results if isinstance(r, Failure))
