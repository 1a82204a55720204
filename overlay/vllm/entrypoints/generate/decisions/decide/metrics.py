# SPDX-License-Identifier: Apache-2.0
"""Decision metrics on vLLM's ``/metrics``: every metric, label and bucket here, one small function per
event, so the request path carries no Prometheus code. Labels are small sets, never model output or a
request id; the adapter label holds the first ``MAX_ADAPTER_LABELS`` names seen, then ``other``.

Made by :func:`init_metrics`, not at import: vLLM's stat logger unregisters every ``vllm:`` collector
when the engine client is built. Under ``--api-server-count N`` each process writes its own to
PROMETHEUS_MULTIPROC_DIR; the temperature gauges are ``mostrecent``, as every process holds the same
calibration. Until then every ``record_...`` does nothing."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any, Protocol, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from vllm.entrypoints.generate.decisions.decide.answers import Answer, Failure
from vllm.entrypoints.generate.decisions.decide.errors import (
    DecisionError,
    EngineBusyError,
    NotReadyError,
    OverLimitError,
)
from vllm.entrypoints.generate.decisions.decide.paths import DECISION_PATHS
from vllm.entrypoints.generate.decisions.decide.temperature import STAGES, Temperatures

ENDPOINTS = DECISION_PATHS
OTHER = "other"

# Adapters loaded at run time are not a bounded set ("": the base model).
MAX_ADAPTER_LABELS = 16
_adapter_labels: set[str] = set()


def adapter_label(name: str) -> str:
    if not name or name in _adapter_labels:
        return name
    if len(_adapter_labels) >= MAX_ADAPTER_LABELS:
        return OTHER
    _adapter_labels.add(name)
    return name


# A request's outcome, from its HTTP status; "cancelled": the client left before the answer.
OUTCOMES = ("ok", "client_error", "unavailable", "server_error", "cancelled")

# Why a request or a question was refused.
INVALID_REQUEST = "invalid_request"  # a 4xx that breaks a rule
OVER_LIMIT = "over_limit"  # a configured limit, the body size or the context
UNAUTHORIZED = "unauthorized"  # a missing or wrong API key
NOT_READY = "not_ready"  # startup work not finished
ENGINE_BUSY = "engine_busy"  # the engine's queue is full
UNAVAILABLE = "unavailable"  # any other 503
BACKEND_ERROR = "backend_error"  # a 5xx from the read path
INTERNAL_ERROR = "internal_error"  # an exception that escaped the route (a bug)
REASONS = (
    INVALID_REQUEST,
    OVER_LIMIT,
    UNAUTHORIZED,
    NOT_READY,
    ENGINE_BUSY,
    UNAVAILABLE,
    BACKEND_ERROR,
    INTERNAL_ERROR,
)
LEVELS = ("request", "question")

READ_KINDS = ("exact", "top_k", "canvas", "pool", "generate")
TEMPERATURE_SOURCES = ("configured", "calibrated", "default")

_LATENCY_STEPS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Whole requests: a few ms on a GPU with a warm prefix cache, up to minutes for many questions on a CPU.
REQUEST_LATENCY_BUCKETS = (*_LATENCY_STEPS, 20.0, 40.0, 80.0, 160.0)
# One forward pass: about a millisecond on a GPU, about 0.1 s for SmolLM2 on a CPU, more when queued.
ENGINE_READ_BUCKETS = (0.001, 0.0025, *_LATENCY_STEPS, 30.0, 60.0)
# The option labels' mass: finer near 1, where a good answer slot puts it, and an edge at 0.5, the
# default VLLM_TYPED_DECISIONS_MIN_OPTION_MASS.
OPTION_MASS_BUCKETS = (0.05, *(i / 10 for i in range(1, 10)), 0.95, 0.99, 1.0)


class DecisionMetrics:
    """The metric objects, in ``registry`` (default: the one vLLM's ``/metrics`` serves)."""

    def __init__(
        self, model_name: str, registry: CollectorRegistry | None = None
    ) -> None:
        self.model_name = model_name
        self.registry = registry if registry is not None else REGISTRY
        counter = partial(Counter, registry=self.registry)
        histogram = partial(Histogram, registry=self.registry)
        gauge = partial(Gauge, multiprocess_mode="mostrecent", registry=self.registry)
        self.requests = counter(
            "vllm:decision_requests",
            "Decision requests, by endpoint and outcome.",
            ["model_name", "endpoint", "outcome"],
        )
        self.questions = counter(
            "vllm:decision_questions",
            "Decision questions, by endpoint, question type, backend, readout, outcome (answered, refused) and "
            "LoRA adapter (empty: the base model).",
            [
                "model_name",
                "endpoint",
                "question_type",
                "backend",
                "readout",
                "outcome",
                "adapter",
            ],
        )
        self.refusals = counter(
            "vllm:decision_refusals",
            "Refused decision requests (level=request: an error response) and questions (level=question), by reason.",
            ["model_name", "endpoint", "level", "reason"],
        )
        self.request_latency = histogram(
            "vllm:decision_request_latency_seconds",
            "Decision request latency in seconds, from the route receiving it to the response.",
            ["model_name", "endpoint", "outcome"],
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        self.engine_read_latency = histogram(
            "vllm:decision_engine_read_latency_seconds",
            "Latency in seconds of each engine read the decision backends make, by kind and phase.",
            ["model_name", "kind", "phase"],
            buckets=ENGINE_READ_BUCKETS,
        )
        self.option_mass = histogram(
            "vllm:decision_option_mass",
            "Next-token probability mass on the option labels, per answered question that reports it.",
            ["model_name", "question_type", "backend", "adapter"],
            buckets=OPTION_MASS_BUCKETS,
        )
        self.temperature = gauge(
            "vllm:decision_calibration_temperature",
            "The calibration temperature in force, server-wide (scope=server) or for a question type's own fit, "
            "for the base model (adapter empty) or a LoRA adapter.",
            ["model_name", "scope", "adapter"],
        )
        self.temperature_source = gauge(
            "vllm:decision_calibration_temperature_source",
            "1 for where the temperature in force for a scope came from (configured, calibrated, default), else 0.",
            ["model_name", "scope", "source", "adapter"],
        )
        self.calibration_stage = gauge(
            "vllm:decision_calibration_stage",
            "1 for the calibration in force (first_pass while the full one reads on in the background, "
            "full after), else 0.",
            ["model_name", "stage", "adapter"],
        )
        # Known label sets start at 0, so rates and dashboards see them before the first event.
        for endpoint in ENDPOINTS:
            for outcome in OUTCOMES:
                self.requests.labels(model_name, endpoint, outcome)
            for level in LEVELS:
                for reason in REASONS:
                    self.refusals.labels(model_name, endpoint, level, reason)

    def unregister(self) -> None:
        for metric in vars(self).values():
            # Already gone when vLLM rebuilt its own stat logger, which unregisters every vllm: collector.
            if isinstance(metric, (Counter, Gauge, Histogram)):
                with suppress(KeyError):
                    self.registry.unregister(metric)


_active: DecisionMetrics | None = None


def init_metrics(
    model_name: str, registry: CollectorRegistry | None = None
) -> DecisionMetrics:
    """Create the metrics in this process (again: the earlier ones are unregistered first)."""
    global _active
    if _active is not None:
        _active.unregister()
    _active = DecisionMetrics(model_name, registry)
    return _active


@dataclass
class Observation:
    """One request while it runs; a 2xx that was never ``decided`` is a client that left."""

    endpoint: str
    reason: str | None = None
    decided: bool = False


# The request being handled; the service's tasks and the host's reads see it too (tasks copy the context).
_observation: ContextVar[Observation | None] = ContextVar(
    "decision_observation", default=None
)


def outcome_label(status: int, decided: bool = True) -> str:
    if status < 400:
        return "ok" if decided else "cancelled"
    if status < 500:
        return "client_error"
    return "unavailable" if status == HTTPStatus.SERVICE_UNAVAILABLE else "server_error"


def refusal_reason(status: int, error: DecisionError | None = None) -> str:
    if isinstance(error, NotReadyError):
        return NOT_READY
    if isinstance(error, EngineBusyError):
        return ENGINE_BUSY
    if (
        isinstance(error, OverLimitError)
        or status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE
    ):
        return OVER_LIMIT
    if status in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
        return UNAUTHORIZED
    if status == HTTPStatus.SERVICE_UNAVAILABLE:
        return UNAVAILABLE
    if status < 500:
        return INVALID_REQUEST
    return BACKEND_ERROR if error is not None else INTERNAL_ERROR


class _Response(Protocol):
    status_code: int


ResponseT = TypeVar("ResponseT", bound=_Response)
Handler = Callable[[Any], Coroutine[Any, Any, ResponseT]]


def observed_route(path: str, handler: Handler[ResponseT]) -> Handler[ResponseT]:
    """``handler`` (error rendering included) counted and timed as one decision request on ``path``."""
    endpoint = path if path in ENDPOINTS else OTHER

    async def observed(request: Any) -> ResponseT:
        observation = Observation(endpoint)
        token = _observation.set(observation)
        started = time.perf_counter()
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            raise
        except BaseException:
            record_request(
                observation,
                HTTPStatus.INTERNAL_SERVER_ERROR,
                time.perf_counter() - started,
            )
            raise
        finally:
            _observation.reset(token)
        record_request(observation, response.status_code, time.perf_counter() - started)
        return response

    return observed


def note_refusal(error: DecisionError) -> None:
    observation = _observation.get()
    if observation is not None:
        observation.reason = refusal_reason(error.status, error)


def record_request(observation: Observation, status: int, seconds: float) -> None:
    metrics = _active
    if metrics is None:
        return
    outcome = outcome_label(status, observation.decided)
    model, endpoint = metrics.model_name, observation.endpoint
    metrics.requests.labels(model, endpoint, outcome).inc()
    metrics.request_latency.labels(model, endpoint, outcome).observe(seconds)
    if status >= 400:
        reason = observation.reason or refusal_reason(status)
        metrics.refusals.labels(model, endpoint, "request", reason).inc()


def record_questions(
    results: Sequence[Answer | Failure], backend: str, adapter: str = ""
) -> None:
    """A request's questions decided by ``backend`` through LoRA ``adapter``."""
    observation = _observation.get()
    if observation is not None:
        observation.decided = True
    metrics = _active
    if metrics is None:
        return
    model = metrics.model_name
    endpoint = observation.endpoint if observation is not None else OTHER
    adapter = adapter_label(adapter)
    for result in results:
        qtype = result.question.qtype.name
        if isinstance(result, Answer):
            labels = (result.backend.name, result.audit.readout, "answered")
            mass = result.audit.option_mass
            if mass is not None and math.isfinite(mass):
                metrics.option_mass.labels(model, qtype, labels[0], adapter).observe(
                    mass
                )
        else:
            labels = (backend, "none", "refused")
            reason = refusal_reason(result.error.status, result.error)
            metrics.refusals.labels(model, endpoint, "question", reason).inc()
        metrics.questions.labels(model, endpoint, qtype, *labels, adapter).inc()


@contextmanager
def engine_read(kind: str) -> Iterator[None]:
    """Times one engine read of ``kind`` (one of READ_KINDS); a read that raises is not timed."""
    started = time.perf_counter()
    yield
    metrics = _active
    if metrics is not None:
        phase = "request" if _observation.get() is not None else "startup"
        metrics.engine_read_latency.labels(metrics.model_name, kind, phase).observe(
            time.perf_counter() - started
        )


def record_temperatures(
    temperatures: Temperatures, adapter: str = "", stage: str | None = None
) -> None:
    """The temperatures in force for LoRA ``adapter`` ("": the base model), and the calibration's
    ``stage`` (one of STAGES; "": none in force any more; None: nothing calibrated, no gauge)."""
    metrics = _active
    if metrics is None:
        return
    model, adapter = metrics.model_name, adapter_label(adapter)
    if stage is not None:
        for name in STAGES:
            metrics.calibration_stage.labels(
                model, name.replace(" ", "_"), adapter
            ).set(name == stage)
    scopes = {"server": temperatures.server, **temperatures.by_type}
    for scope, applied in scopes.items():
        metrics.temperature.labels(model, scope, adapter).set(applied.value)
        for source in {*TEMPERATURE_SOURCES, applied.source}:
            metrics.temperature_source.labels(model, scope, source, adapter).set(
                source == applied.source
            )
