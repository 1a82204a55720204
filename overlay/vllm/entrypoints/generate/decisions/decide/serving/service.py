# SPDX-License-Identifier: Apache-2.0
"""The one decision path both endpoints call: limits -> backend read -> temperature -> answer -> audit."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol

from vllm.entrypoints.generate.decisions.decide.answers import Answer, Decision, Failure
from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.backends.base import facts_json
from vllm.entrypoints.generate.decisions.decide.backends.registry import (
    backend_class,
    backend_names,
    failures_note,
)
from vllm.entrypoints.generate.decisions.decide.budget import over_request_message
from vllm.entrypoints.generate.decisions.decide.concurrency import gather_or_cancel
from vllm.entrypoints.generate.decisions.decide.errors import (
    BackendUnavailable,
    DecisionError,
    EngineBusyError,
    OverLimitError,
    internal_error,
    shown,
    without_paths,
)
from vllm.entrypoints.generate.decisions.decide.metrics import (
    record_questions,
    record_temperatures,
)
from vllm.entrypoints.generate.decisions.decide.questions import (
    CompiledQuestion,
    QuestionType,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.corrections import (
    Asked,
    Calibration,
    Corrections,
)
from vllm.entrypoints.generate.decisions.decide.reading.read import plan_read, read
from vllm.entrypoints.generate.decisions.decide.reports import (
    AuditRecord,
    BackendReport,
)
from vllm.entrypoints.generate.decisions.decide.scoring import (
    CONFIDENCE_FORMULA,
    confidence,
    non_finite,
    softmax,
)
from vllm.entrypoints.generate.decisions.decide.serving.readiness import (
    CALIBRATION,
    SELF_CHECK,
    Readiness,
)
from vllm.entrypoints.generate.decisions.decide.serving.request import DecisionRequest
from vllm.entrypoints.generate.decisions.decide.settings import (
    PREFIX,
    Settings,
    SettingsError,
)
from vllm.entrypoints.generate.decisions.decide.temperature import (
    DEFAULT,
    FIRST_PASS,
    SERVER,
    Temperature,
    Temperatures,
)
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

logger = init_logger(__name__)


def check_question_count(settings: Settings, count: int) -> None:
    if count > settings.max_questions:
        raise OverLimitError(
            f"{count} questions in one request; the limit is {settings.max_questions} "
            f"(set {PREFIX}MAX_QUESTIONS to raise it)"
        )


def check_option_count(
    settings: Settings, qtype: QuestionType, count: int, name: str
) -> None:
    if (limit := qtype.options_limit) is None:
        return
    most = getattr(settings, limit.setting)
    if count > most:
        raise OverLimitError(
            f"{name} has {count} {limit.noun}; the limit is {most} (set {PREFIX}{limit.setting.upper()} to raise it)"
        )


def request_chars(request: DecisionRequest) -> int:
    texts = (
        len(q.instructions) + sum(len(o.text) for o in q.options)
        for q in request.questions
    )
    return len(request.state) + sum(texts)


class Decides(Protocol):
    """What the wires and bulk decide through: a service, or runtime/adapters.py's ServedModels."""

    @property
    def settings(self) -> Settings: ...

    async def decide(self, request: DecisionRequest) -> Decision: ...


class DecisionService:
    """Decides requests on one model: the base, or the base through one LoRA adapter."""

    def __init__(
        self,
        settings: Settings,
        backend: DecisionBackend,
        served_model: str,
        starter: Callable[[DecisionBackend], Awaitable[Any]] | None = None,
        readiness: Readiness | None = None,
        adapter: LoRARequest | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self._others: dict[str, DecisionBackend] = {}
        self._building = asyncio.Lock()
        # Starts every backend, the default and any a request names (startup.py: once per server).
        self.starter = starter or (lambda chosen: chosen.start())
        self.served_model = served_model
        self.adapter = adapter
        # The key of this service's saved startup work (startup.py).
        self.deployment: dict[str, Any] = {"model": served_model}
        self.readiness = readiness or Readiness()
        server = DEFAULT
        if settings.temperature:
            server = Temperature(settings.temperature, "configured", SERVER)
        # The calibration in force, replaced as one object: a request takes it once, at its start.
        self.calibrated = Calibration(Temperatures(server))
        self.corrections = Corrections(
            settings.prior, settings.prior_cache, settings.prior_cache_bytes
        )
        # calibration/live_labels.py's watcher, cancelled on close.
        self.background: set[asyncio.Task[None]] = set()

    def close(self) -> None:
        for task in list(self.background):
            task.cancel()

    async def start(
        self, calibrate: Callable[[], Awaitable[Calibration]] | None = None
    ) -> None:
        """The backend's start, then calibration unless T is configured, each a readiness step."""
        try:
            self.readiness.begin(SELF_CHECK)
            await self.starter(self.backend)
            if calibrate is not None and self.temperatures.server.source == "default":
                self.readiness.begin(CALIBRATION)
                calibrated = await calibrate()
                replaces = self.calibrated.stage == FIRST_PASS
                self.calibrated = calibrated
                if replaces:
                    # A failed full calibration (T = 1.0, no stage) leaves no stage in force.
                    record_temperatures(
                        self.temperatures, self.adapter_name, calibrated.stage or ""
                    )
                    logger.info(
                        "decision calibration: the full calibration replaces the first pass%s: %s",
                        self.through,
                        self.temperatures.describe(),
                    )
                    return
        except Exception as exc:
            # Answering on a first pass already, it stays in force; start_service logs why either way.
            if self.calibrated.stage != FIRST_PASS:
                # What the 503 says: a fault's text stays in the server's log.
                self.readiness.fail(
                    without_paths(str(exc))
                    if isinstance(exc, (BackendUnavailable, SettingsError))
                    else f"the startup work failed ({type(exc).__name__}); the server's log says why"
                )
            raise
        self._ready("")

    def use_first_pass(self, calibrated: Calibration) -> None:
        self.calibrated = calibrated
        self._ready(
            f" after calibration's first pass ({calibrated.question_reads} question reads; "
            "the full calibration continues in the background)"
        )

    def _ready(self, after: str) -> None:
        self.readiness.succeed()
        record_temperatures(self.temperatures, self.adapter_name, self.calibrated.stage)
        logger.info(
            "decisions ready%s%s: backend=%s, %s",
            self.through,
            after,
            self.backend.name,
            self.temperatures.describe(),
        )

    @property
    def temperatures(self) -> Temperatures:
        return self.calibrated.temperatures

    @property
    def through(self) -> str:
        name = self.adapter_name
        return f" through LoRA adapter {name!r}" if self.adapter is not None else ""

    @property
    def adapter_name(self) -> str:
        return self.adapter.lora_name if self.adapter is not None else ""

    def check_limits(self, request: DecisionRequest) -> None:
        """Refuse a request over a configured limit before any model work (wires check counts too)."""
        s = self.settings
        if len(request.state) > s.max_input_chars:
            raise OverLimitError(
                f"the input is {len(request.state)} characters; the limit is {s.max_input_chars} "
                f"(set {PREFIX}MAX_INPUT_CHARS to raise it)"
            )
        questions = request.questions
        if not questions:
            raise DecisionError("a request needs at least one question")
        check_question_count(s, len(questions))
        for name, q in zip(request.names, questions, strict=True):
            check_option_count(s, q.qtype, len(q.options), name)
        if request_chars(request) > s.max_request_chars:
            raise OverLimitError(over_request_message(s.max_request_chars))
        if request.temperature is not None and (
            problem := s.temperature_problem(request.temperature)
        ):
            raise DecisionError(
                f"extra.calibration_temperature={problem}",
                param="extra.calibration_temperature",
            )
        if request.priority and not getattr(
            self.backend.host, "priority_scheduling", False
        ):
            # vLLM's own APIs document the same refusal; its first-come scheduler would ignore the number.
            raise DecisionError(
                f"priority {request.priority} needs vllm serve --scheduling-policy priority; this "
                "server schedules first come, first served (send 0 or leave priority out)"
            )

    async def decide(self, request: DecisionRequest) -> Decision:
        """Answer every question of ``request``, concurrently; a failed question doesn't stop the rest."""
        # A request over a limit would be refused whenever it came: say so now, not "retry shortly".
        self.check_limits(request)
        self.readiness.check()
        chosen = await self.backend_named(request.backend, request.request_id)
        overrides = dict(request.backend_options) if request.backend_options else None
        options = chosen.seeded(chosen.request_options(overrides), request.seed)
        layout_option = chosen.layout_option
        asked = Asked(
            request.debias or self.settings.debias,
            request.prior,
            (overrides or {}).get(layout_option) if layout_option else None,
        )
        # A question's failure is its own refusal (``_answer`` returns it); only the engine refusing a
        # read (queue full) escapes, and then the other reads are cancelled and the request refused.
        # Engine request ids: decision-<request id>-<question>, so vLLM's request log shows whose reads they are.
        contexts = [
            ReadContext(
                request.state,
                request.state_sha256,
                f"decision-{request.request_id}-{i}",
                options,
                request.cache_salt,
                request.priority,
                self.adapter,
            )
            for i in range(len(request.questions))
        ]
        # One calibration for the whole request, even if the full one replaces the first pass meanwhile.
        calibrated = self.calibrated
        reads = (
            self._answer(
                chosen, question, context, request.temperature, asked, calibrated
            )
            for question, context in zip(request.questions, contexts, strict=True)
        )
        results = await gather_or_cancel(reads)
        record_questions(results, chosen.name, self.adapter_name)
        return Decision(self.served_model, results)

    async def backend_named(
        self, name: str | None, request_id: str = ""
    ) -> DecisionBackend:
        """The server's backend, or another one built and started with its defaults (or a 400)."""
        if name is None or name == self.backend.name:
            return self.backend
        if name in self._others:
            return self._others[name]
        async with self._building:
            if name not in self._others:
                cls = backend_class(name)
                if cls is None:
                    loaded = ", ".join(backend_names())
                    raise DecisionError(
                        f"extra.backend={shown(name)}: unknown backend; loaded backends: {loaded}"
                        + failures_note()
                    )
                try:
                    other = cls(self.backend.host, None, self.settings)
                    await self.starter(other)
                except BackendUnavailable as exc:
                    logger.warning(
                        "decision %s: backend %r can't serve this model: %s",
                        request_id,
                        name,
                        exc,
                    )
                    raise DecisionError(
                        f"extra.backend={shown(name)}: backend {shown(name)} could not start for this model: "
                        f"{without_paths(str(exc))}; name another backend or leave extra.backend out "
                        f"(this server's backend: {self.backend.name!r})",
                        param="extra.backend",
                    ) from None
                except Exception:
                    logger.exception(
                        "decision %s: backend %r failed to start", request_id, name
                    )
                    raise internal_error(request_id) from None
                self._others[name] = other
        return self._others[name]

    async def _answer(
        self,
        backend: DecisionBackend,
        question: CompiledQuestion,
        context: ReadContext[Any],
        requested: float | None,
        asked: Asked,
        calibrated: Calibration,
    ) -> Answer | Failure:
        try:
            how = calibrated.resolve(
                question, asked, self.corrections, requested, backend is self.backend
            )
            plan = plan_read(backend, question, context, asked.debias, how)
            done = await read(plan)
        except EngineBusyError:
            raise
        except DecisionError as exc:
            if exc.status >= HTTPStatus.INTERNAL_SERVER_ERROR:
                logger.error("decision %s: %s", context.request_id, exc.message)
            return Failure(question, exc)
        except Exception:  # a fault in one question must not sink the others; its text stays in the log
            logger.exception("decision read failed for %s", context.request_id)
            return Failure(question, internal_error(context.request_id))
        keys = [o.key for o in question.options]
        applied, reading, scores = plan.temperature, done.reading, done.scores
        probabilities = softmax(scores, applied.value)
        made = confidence(probabilities)
        fields = question.qtype.answer(probabilities, question.options)
        # The one check that every number an answer sends is real (softmax can't make one that isn't; a
        # question type's own fields might): a question that fails it is refused, never sent as null.
        sent = {"probabilities": probabilities, "confidence": made, **fields}
        if (where := non_finite(sent)) is not None:
            logger.error(
                "decision %s: %s of a %s answer is not a finite number (scores %s, T=%r)",
                context.request_id,
                where.lstrip("."),
                question.qtype.name,
                scores,
                applied.value,
            )
            return Failure(question, internal_error(context.request_id))
        audit = AuditRecord(
            served_model=self.served_model,
            adapter=self.adapter_name or None,
            state_sha256=context.state_sha256,
            render_version=backend.render_version,
            confidence_formula=CONFIDENCE_FORMULA,
            calibration_temperature=applied.value,
            temperature_source=applied.source,
            temperature_scope=applied.scope,
            calibration_stage=calibrated.stage,
            calibration_reads=calibrated.question_reads,
            forward_passes=reading.forward_passes,
            input_tokens=reading.input_tokens,
            cached_input_tokens=reading.cached_input_tokens,
            option_mass=reading.option_mass,
            readout=reading.readout,
            backend=facts_json(reading.audit),
            debias=done.debias,
            prior=done.prior,
            question_map=how.question_map,
            examples=how.examples_audit,
        )
        return Answer(
            question=question,
            probabilities=probabilities,
            confidence=made,
            fields=fields,
            backend=BackendReport(
                name=backend.name,
                option_logits=dict(zip(keys, done.raw, strict=True)),
                facts=facts_json(reading.meta),
            ),
            audit=audit,
            input_tokens=reading.input_tokens,
            cached_tokens=reading.cached_input_tokens,
            abstention=(
                how.abstention(max(probabilities))
                if how.abstention is not None
                else None
            ),
        )
