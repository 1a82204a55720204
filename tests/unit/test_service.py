from __future__ import annotations

import asyncio
import math
from http import HTTPStatus

import pytest

from tests.unit.asking import ask
from vllm.entrypoints.generate.decisions.calibration.in_force import Calibrated
from vllm.entrypoints.generate.decisions.decide.errors import (
    BackendUnavailable,
    DecisionError,
    NotReadyError,
)
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    SCORE,
    ChoiceQuestion,
    NoulQuestion,
    ScoreQuestion,
)
from vllm.entrypoints.generate.decisions.decide.serving.service import (
    Answer,
    DecisionService,
    Failure,
)
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.decide.temperature import (
    Temperature,
    Temperatures,
)

from .fakes import ScriptedBackend


def noul(text="Urgent?"):
    return NOUL.compile(NoulQuestion(instructions=text))


def choice(n):
    return CHOICE.compile(
        ChoiceQuestion(
            instructions="Which?", criteria={f"o{i}": None for i in range(n)}
        )
    )


async def started(backend, **env):
    service = DecisionService(Settings.from_env(env), backend, "served")
    await service.start()
    return service


async def test_answers_carry_probabilities_confidence_and_audit():
    service = await started(ScriptedBackend(lambda q: [math.log(0.6), math.log(0.2)]))
    decision = await service.decide(ask("state", [noul()], "r"))
    (answer,) = decision.results
    assert isinstance(answer, Answer)
    assert answer.probabilities == pytest.approx([0.75, 0.25])
    assert answer.fields == {"probability": pytest.approx(0.75)}
    assert answer.confidence == pytest.approx(0.5)
    assert answer.backend.option_logits == {
        "true": math.log(0.6),
        "false": math.log(0.2),
    }
    audit = answer.audit.as_json()
    assert (
        audit["temperature_source"] == "default"
        and audit["calibration_temperature"] == 1.0
    )
    assert audit["temperature_scope"] == "server"
    assert audit["option_mass"] == pytest.approx(0.8)
    assert audit["render_version"] == "scripted-1" and audit["served_model"] == "served"
    assert len(audit["state_sha256"]) == 64


async def test_questions_are_read_concurrently():
    backend = ScriptedBackend(lambda q: [0.0, -1.0], delay=0.05)
    service = await started(backend)
    await service.decide(ask("s", [noul(f"q{i}") for i in range(4)], "r"))
    assert backend.most_in_flight == 4


async def test_a_failed_question_does_not_stop_the_others():
    service = await started(
        ScriptedBackend(lambda q: None if q.instructions == "bad" else [0.0, -1.0])
    )
    decision = await service.decide(ask("s", [noul("good"), noul("bad")], "r"))
    assert isinstance(decision.results[0], Answer) and isinstance(
        decision.results[1], Failure
    )
    assert decision.first_failure() is None


async def test_when_every_question_fails_the_first_failure_is_reported():
    service = await started(ScriptedBackend(lambda q: None))
    decision = await service.decide(ask("s", [noul("first"), noul("second")], "r"))
    assert "first" in decision.first_failure().message


async def test_an_unexpected_fault_becomes_a_500_failure():
    def explode(q):
        raise RuntimeError("boom")

    service = await started(ScriptedBackend(explode))
    (failure,) = (await service.decide(ask("s", [noul()], "r"))).results
    assert failure.error.status == HTTPStatus.INTERNAL_SERVER_ERROR


async def test_configured_and_per_request_temperatures():
    scores = [math.log(0.9), math.log(0.1)]
    service = await started(
        ScriptedBackend(lambda q: scores), VLLM_TYPED_DECISIONS_TEMPERATURE="2.0"
    )
    (a,) = (await service.decide(ask("s", [noul()], "r"))).results
    assert applied(a) == (2.0, "configured", "server")
    assert a.probabilities[0] == pytest.approx(3 / 4)
    (b,) = (await service.decide(ask("s", [noul()], "r", temperature=1.0))).results
    assert applied(b) == (1.0, "request", "request") and b.probabilities[
        0
    ] == pytest.approx(0.9)


CALIBRATED = Temperatures(
    Temperature(2.0, "calibrated", "server"),
    {
        "choice": Temperature(4.0, "calibrated", "choice"),
        "noul": Temperature(1.0, "calibrated", "noul"),
    },
)


def applied(answer):
    audit = answer.audit.as_json()
    return (
        audit["calibration_temperature"],
        audit["temperature_source"],
        audit["temperature_scope"],
    )


async def calibrated_service(backend, **env):
    async def calibrate():
        return Calibrated(CALIBRATED)

    service = DecisionService(Settings.from_env(env), backend, "served")
    await service.start(calibrate)
    return service


async def test_each_question_gets_its_types_temperature_unless_the_request_sets_one(
    caplog,
):
    scores = [math.log(0.9), math.log(0.1)]
    service = await calibrated_service(ScriptedBackend(lambda q: scores))
    score = SCORE.compile(ScoreQuestion(criteria=["low", "high"]))
    decision = await service.decide(ask("s", [noul(), choice(2), score], "r"))
    assert [applied(a) for a in decision.results] == [
        (1.0, "calibrated", "noul"),
        (4.0, "calibrated", "choice"),
        (2.0, "calibrated", "server"),  # no fit of its own: the server-wide one
    ]
    assert decision.results[0].probabilities[0] == pytest.approx(0.9)
    assert decision.results[1].probabilities[0] == pytest.approx(
        0.9**0.25 / (0.9**0.25 + 0.1**0.25)
    )
    requested = await service.decide(
        ask("s", [noul(), choice(2)], "r", temperature=3.0)
    )
    assert [applied(a) for a in requested.results] == [(3.0, "request", "request")] * 2
    assert (
        "decisions ready: backend=scripted, T=2.00 (calibrated, server); choice T=4.00 (calibrated), "
        in caplog.text
    )


async def test_a_configured_temperature_beats_calibration_for_every_type():
    service = await calibrated_service(
        ScriptedBackend(lambda q: [0.0, -1.0]), VLLM_TYPED_DECISIONS_TEMPERATURE="1.5"
    )
    decision = await service.decide(ask("s", [noul(), choice(2)], "r"))
    assert [applied(a) for a in decision.results] == [(1.5, "configured", "server")] * 2


def test_temperatures_precedence():
    assert CALIBRATED.applied("choice") == Temperature(4.0, "calibrated", "choice")
    assert CALIBRATED.applied("plugin-type") == CALIBRATED.server
    assert CALIBRATED.applied("choice", 0.5) == Temperature(0.5, "request", "request")
    assert Temperatures().applied("choice") == Temperature(1.0, "default", "server")


@pytest.mark.parametrize(
    ("env", "questions", "variable"),
    [
        (
            {"VLLM_TYPED_DECISIONS_MAX_QUESTIONS": "2"},
            [noul()] * 3,
            "VLLM_TYPED_DECISIONS_MAX_QUESTIONS",
        ),
        (
            {"VLLM_TYPED_DECISIONS_MAX_CHOICES": "3"},
            [choice(4)],
            "VLLM_TYPED_DECISIONS_MAX_CHOICES",
        ),
        (
            {"VLLM_TYPED_DECISIONS_MAX_LEVELS": "2"},
            [SCORE.compile(ScoreQuestion(criteria=["a", "b", "c"]))],
            "VLLM_TYPED_DECISIONS_MAX_LEVELS",
        ),
    ],
)
async def test_limits_refuse_before_any_read_and_name_the_setting(
    env, questions, variable
):
    backend = ScriptedBackend(lambda q: pytest.fail("no read may happen over a limit"))
    service = await started(backend, **env)
    with pytest.raises(DecisionError, match=variable) as caught:
        await service.decide(ask("s", questions, "r"))
    assert caught.value.status == HTTPStatus.BAD_REQUEST


async def test_not_ready_then_unavailable():
    backend = ScriptedBackend(lambda q: [0.0, 0.0])
    service = DecisionService(Settings.from_env({}), backend, "served")
    with pytest.raises(NotReadyError, match="decisions are starting") as starting:
        await service.decide(ask("s", [noul()], "r"))
    assert (
        starting.value.retry_after == 5
        and starting.value.status == HTTPStatus.SERVICE_UNAVAILABLE
    )

    async def broken_start():
        raise BackendUnavailable(
            "the model never answers with a letter (see /home/op/models/m/config.json)"
        )

    backend.start = broken_start  # type: ignore[method-assign]
    with pytest.raises(BackendUnavailable):
        await service.start()
    # A backend's own refusal says why and what to change; a local path in it is left out.
    with pytest.raises(DecisionError, match="never answers") as caught:
        await service.decide(ask("s", [noul()], "r"))
    assert (
        caught.value.status == HTTPStatus.SERVICE_UNAVAILABLE
        and "/home/op" not in caught.value.message
    )


async def test_while_starting_the_refusal_names_the_step_running_and_its_progress():
    backend = ScriptedBackend(lambda q: [0.0, 0.0])
    checked, calibrated = asyncio.Event(), asyncio.Event()

    async def slow_start(chosen):
        await checked.wait()

    async def slow_calibration():
        service.readiness.count(40, "reads")
        service.readiness.advance(3)
        await calibrated.wait()
        return Calibrated(Temperatures(Temperature(2.0, "calibrated", "server")))

    service = DecisionService(
        Settings.from_env({}), backend, "served", starter=slow_start
    )
    starting = asyncio.ensure_future(service.start(slow_calibration))
    await asyncio.sleep(0.01)
    with pytest.raises(
        NotReadyError, match="^decisions are starting: self-check; retry shortly$"
    ):
        await service.decide(ask("s", [noul()], "r"))
    # A request no server would take is refused for what it is, not told to retry.
    with pytest.raises(DecisionError, match="calibration_temperature") as refused:
        await service.decide(ask("s", [noul()], "r", temperature=1e-310))
    assert refused.value.status == HTTPStatus.BAD_REQUEST
    checked.set()
    await asyncio.sleep(0.01)
    with pytest.raises(
        NotReadyError, match="calibration, 3 of 40 reads, time left unknown yet"
    ):
        await service.decide(ask("s", [noul()], "r"))
    calibrated.set()
    await starting
    (answer,) = (await service.decide(ask("s", [noul()], "r"))).results
    assert isinstance(answer, Answer) and answer.audit.calibration_temperature == 2.0


async def test_a_failed_calibration_makes_decisions_unavailable_not_starting_forever():
    async def broken():
        raise RuntimeError("the question file vanished")

    service = DecisionService(
        Settings.from_env({}), ScriptedBackend(lambda q: [0.0, 0.0]), "served"
    )
    with pytest.raises(RuntimeError):
        await service.start(broken)
    await asyncio.wait_for(service.readiness.settled(), 1)
    # A fault's own text (it may hold paths or secrets) stays in the log; the refusal names its kind only.
    with pytest.raises(
        DecisionError, match=r"unavailable: the startup work failed \(RuntimeError\)"
    ) as caught:
        await service.decide(ask("s", [noul()], "r"))
    assert (
        not isinstance(caught.value, NotReadyError)
        and "vanished" not in caught.value.message
    )


@pytest.mark.parametrize(
    ("scores", "needle"),
    [
        ([float("nan"), 0.0], "NaN or +inf"),
        ([float("inf"), 0.0], "NaN or +inf"),
        ([0.0], "returned 1 scores for 2 options"),
        ([0.0, 0.0, 0.0], "returned 3 scores for 2 options"),
        ([-math.inf, -math.inf], "zero probability"),
    ],
)
async def test_a_backend_fault_is_one_refusal_not_nan(scores, needle):
    faulty = {"Faulty?"}
    service = await started(
        ScriptedBackend(lambda q: scores if q.instructions in faulty else [-0.1, -2.5])
    )
    decision = await service.decide(ask("state", [noul("Faulty?"), noul("Fine?")], "r"))
    failure, answer = decision.results
    assert isinstance(failure, Failure) and needle in failure.error.message
    assert failure.error.status == HTTPStatus.INTERNAL_SERVER_ERROR
    assert "'scripted'" in failure.error.message
    assert isinstance(answer, Answer) and all(
        math.isfinite(p) for p in answer.probabilities
    )


async def test_scores_of_other_number_types_are_accepted():
    import numpy as np

    service = await started(
        ScriptedBackend(lambda q: [np.float32(-0.1), np.float64(-2.0)])
    )
    (answer,) = (await service.decide(ask("state", [noul()], "r"))).results
    assert (
        isinstance(answer, Answer)
        and type(answer.backend.option_logits["true"]) is float
    )


async def test_engine_queue_full_refuses_the_request_and_cancels_the_other_reads():
    from vllm.entrypoints.generate.decisions.decide.errors import EngineBusyError

    class Busy(ScriptedBackend):
        async def read(self, question, context):
            if question.instructions == "Busy?":
                await asyncio.sleep(0.01)
                raise EngineBusyError("--max-num-queued-reqs")
            return await super().read(question, context)

    backend = Busy(lambda q: [-0.1, -2.5], delay=30)
    service = await started(backend)
    with pytest.raises(EngineBusyError) as caught:
        await asyncio.wait_for(
            service.decide(
                ask("state", [noul("Slow?"), noul("Busy?"), noul("Slow too?")], "r")
            ),
            5,
        )
    assert (
        caught.value.retry_after
        and caught.value.status == HTTPStatus.SERVICE_UNAVAILABLE
    )
    assert "--max-num-queued-reqs" in caught.value.message
    assert backend.in_flight == 0  # the slow reads were cancelled, not left running


@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 1e-4, 5000.0])
async def test_a_request_temperature_outside_the_range_is_refused_naming_the_settings(
    temperature,
):
    backend = ScriptedBackend(
        lambda q: pytest.fail("no read for a refused temperature")
    )
    service = await started(backend)
    with pytest.raises(
        DecisionError,
        match="VLLM_TYPED_DECISIONS_MIN_TEMPERATURE and .*MAX_TEMPERATURE",
    ) as caught:
        await service.decide(ask("s", [noul()], "r", temperature=temperature))
    assert (
        caught.value.status == HTTPStatus.BAD_REQUEST
        and caught.value.param == "extra.calibration_temperature"
    )


async def test_the_range_is_the_servers_and_its_ends_apply():
    service = await started(
        ScriptedBackend(lambda q: [0.0, -1.0]),
        VLLM_TYPED_DECISIONS_MAX_TEMPERATURE="10",
    )
    for temperature in (0.001, 10.0):
        (answer,) = (
            await service.decide(ask("s", [noul()], "r", temperature=temperature))
        ).results
        assert (
            isinstance(answer, Answer)
            and answer.audit.calibration_temperature == temperature
        )
    with pytest.raises(
        DecisionError,
        match="outside the temperatures this server applies, 0.001 to 10.0",
    ):
        await service.decide(ask("s", [noul()], "r", temperature=10.5))


async def test_an_answer_field_that_is_not_a_number_is_refused_not_sent_as_null():
    """A question type's own fields are checked where the answer is made (softmax can't make a NaN)."""

    class Broken(type(NOUL)):  # type: ignore[misc]
        def answer(self, probabilities, options):
            return {"probability": math.nan}

    question = Broken().compile(NoulQuestion(instructions="Urgent?"))
    service = await started(ScriptedBackend(lambda q: [0.0, -1.0]))
    broken, fine = (await service.decide(ask("s", [question, noul()], "req-7"))).results
    assert (
        isinstance(broken, Failure)
        and broken.error.status == HTTPStatus.INTERNAL_SERVER_ERROR
    )
    assert "req-7" in broken.error.message and isinstance(fine, Answer)


async def test_a_fault_in_a_read_is_refused_without_its_text():
    def read(question):
        raise RuntimeError("secret sk-123 in /home/op/plugin.py")

    service = await started(ScriptedBackend(read))
    (failure,) = (await service.decide(ask("s", [noul()], "req-9"))).results
    assert (
        isinstance(failure, Failure)
        and failure.error.status == HTTPStatus.INTERNAL_SERVER_ERROR
    )
    assert (
        "sk-123" not in failure.error.message and "/home" not in failure.error.message
    )
    assert "req-9" in failure.error.message


async def test_a_backend_that_cant_serve_the_model_is_a_400_saying_what_to_change():
    async def starter(chosen):
        if chosen.name == "canvas":
            raise BackendUnavailable(
                "the canvas backend needs a diffusion model (see /opt/models/gemma)"
            )
        if chosen.name == "encoder":
            raise OSError(
                "[Errno 2] No such file: '/home/op/.cache/hf/laya/config.json'"
            )

    service = DecisionService(
        Settings.from_env({}),
        ScriptedBackend(lambda q: [0.0, -1.0]),
        "served",
        starter=starter,
    )
    await service.start()
    with pytest.raises(DecisionError) as refused:
        await service.decide(ask("s", [noul()], "r", backend="canvas"))
    message = refused.value.message
    assert (
        refused.value.status == HTTPStatus.BAD_REQUEST
        and refused.value.param == "extra.backend"
    )
    assert (
        "needs a diffusion model" in message
        and "leave extra.backend out" in message
        and "/opt" not in message
    )
    with pytest.raises(DecisionError) as fault:
        await service.decide(ask("s", [noul()], "req-3", backend="encoder"))
    assert fault.value.status == HTTPStatus.INTERNAL_SERVER_ERROR
    assert (
        "/home" not in fault.value.message
        and "Errno" not in fault.value.message
        and "req-3" in fault.value.message
    )
