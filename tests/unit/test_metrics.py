"""The decision metrics (metrics.py), read back from a registry of their own: each recording function,
the refusal reasons, and the counts a request through the routes leaves behind."""

from __future__ import annotations

import asyncio
import math
from http import HTTPStatus

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from tests.unit.asking import ask
from vllm.entrypoints.generate.decisions.decide import metrics
from vllm.entrypoints.generate.decisions.decide.errors import (
    DecisionError,
    EngineBusyError,
    NotReadyError,
    OverLimitError,
)
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    ChoiceQuestion,
    NoulQuestion,
)
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.decide.temperature import (
    Temperature,
    Temperatures,
)
from vllm.entrypoints.generate.decisions.http.api_router import (
    register_decisions_api_router,
)

from .fakes import ScriptedBackend

MODEL = "scripted-model"


@pytest.fixture
def registry(monkeypatch) -> CollectorRegistry:
    """Fresh metrics in a registry of their own, made inactive again after the test."""
    monkeypatch.setattr(metrics, "_active", None)
    own = CollectorRegistry()
    metrics.init_metrics(MODEL, own)
    return own


# Metrics labelled by LoRA adapter: these tests read the base model's ("").
ADAPTER_LABELLED = (
    "vllm:decision_questions",
    "vllm:decision_option_mass",
    "vllm:decision_calibration_temperature",
)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    adapter = {"adapter": ""} if name.startswith(ADAPTER_LABELLED) else {}
    found = registry.get_sample_value(name, {"model_name": MODEL, **adapter, **labels})
    return 0.0 if found is None else found


def noul(text: str = "Urgent?"):
    return NOUL.compile(NoulQuestion(instructions=text))


def choice(n: int):
    return CHOICE.compile(
        ChoiceQuestion(
            instructions="Which?", criteria={f"o{i}": None for i in range(n)}
        )
    )


@pytest.mark.parametrize(
    ("status", "error", "reason"),
    [
        (503, NotReadyError(), "not_ready"),
        (503, EngineBusyError("--max-num-queued-reqs"), "engine_busy"),
        (400, OverLimitError("too many"), "over_limit"),
        (413, None, "over_limit"),
        (400, DecisionError("bad field"), "invalid_request"),
        (422, None, "invalid_request"),
        (415, None, "invalid_request"),
        (401, None, "unauthorized"),
        (
            503,
            DecisionError("startup failed", HTTPStatus.SERVICE_UNAVAILABLE),
            "unavailable",
        ),
        (
            500,
            DecisionError("bad scores", HTTPStatus.INTERNAL_SERVER_ERROR),
            "backend_error",
        ),
        (501, DecisionError("no pooling", HTTPStatus.NOT_IMPLEMENTED), "backend_error"),
        (500, None, "internal_error"),
    ],
)
def test_refusal_reasons_are_a_small_fixed_set(status, error, reason):
    assert metrics.refusal_reason(status, error) == reason
    assert reason in metrics.REASONS


@pytest.mark.parametrize(
    ("status", "decided", "outcome"),
    [
        (200, True, "ok"),
        (200, False, "cancelled"),
        (422, True, "client_error"),
        (503, False, "unavailable"),
        (500, True, "server_error"),
    ],
)
def test_outcomes_come_from_the_status(status, decided, outcome):
    assert metrics.outcome_label(status, decided) == outcome


def test_nothing_is_recorded_before_init(monkeypatch):
    monkeypatch.setattr(metrics, "_active", None)
    metrics.record_temperatures(Temperatures())
    metrics.record_request(metrics.Observation("/v1/decisions"), 200, 0.1)
    with metrics.engine_read("exact"):
        pass


def test_known_label_sets_start_at_zero(registry):
    for endpoint in metrics.ENDPOINTS:
        assert (
            registry.get_sample_value(
                "vllm:decision_requests_total",
                {"model_name": MODEL, "endpoint": endpoint, "outcome": "ok"},
            )
            == 0.0
        )
        assert (
            registry.get_sample_value(
                "vllm:decision_refusals_total",
                {
                    "model_name": MODEL,
                    "endpoint": endpoint,
                    "level": "request",
                    "reason": "over_limit",
                },
            )
            == 0.0
        )


def test_a_request_counts_its_outcome_latency_and_refusal(registry):
    observation = metrics.Observation("/v1/systemone", reason="not_ready")
    metrics.record_request(observation, 503, 0.002)
    metrics.record_request(metrics.Observation("/v1/systemone", decided=True), 200, 0.3)
    assert (
        value(
            registry,
            "vllm:decision_requests_total",
            endpoint="/v1/systemone",
            outcome="unavailable",
        )
        == 1
    )
    assert (
        value(
            registry,
            "vllm:decision_requests_total",
            endpoint="/v1/systemone",
            outcome="ok",
        )
        == 1
    )
    assert (
        value(
            registry,
            "vllm:decision_refusals_total",
            endpoint="/v1/systemone",
            level="request",
            reason="not_ready",
        )
        == 1
    )
    ok = {"endpoint": "/v1/systemone", "outcome": "ok"}
    assert value(registry, "vllm:decision_request_latency_seconds_count", **ok) == 1
    assert value(
        registry, "vllm:decision_request_latency_seconds_sum", **ok
    ) == pytest.approx(0.3)
    assert (
        value(registry, "vllm:decision_request_latency_seconds_bucket", le="0.25", **ok)
        == 0
    )
    assert (
        value(registry, "vllm:decision_request_latency_seconds_bucket", le="0.5", **ok)
        == 1
    )


async def test_questions_count_answers_refusals_and_option_mass(registry):
    backend = ScriptedBackend(
        lambda q: None if q.instructions == "bad" else [math.log(0.6), math.log(0.2)]
    )
    service = DecisionService(Settings.from_env({}), backend, MODEL)
    await service.start()
    await service.decide(ask("s", [noul("good"), noul("bad"), noul("fine")], "r"))
    answered = {
        "endpoint": "other",
        "question_type": "noul",
        "backend": "scripted",
        "readout": "direct",
    }
    assert (
        value(registry, "vllm:decision_questions_total", outcome="answered", **answered)
        == 2
    )
    refused = {**answered, "readout": "none", "outcome": "refused"}
    assert value(registry, "vllm:decision_questions_total", **refused) == 1
    assert (
        value(
            registry,
            "vllm:decision_refusals_total",
            endpoint="other",
            level="question",
            reason="invalid_request",
        )
        == 1
    )
    mass = {"question_type": "noul", "backend": "scripted"}
    assert value(registry, "vllm:decision_option_mass_count", **mass) == 2
    assert value(registry, "vllm:decision_option_mass_sum", **mass) == pytest.approx(
        1.6
    )
    assert value(registry, "vllm:decision_option_mass_bucket", le="0.7", **mass) == 0
    assert value(registry, "vllm:decision_option_mass_bucket", le="0.9", **mass) == 2


async def test_a_start_sets_the_temperature_gauges(registry):
    await DecisionService(
        Settings.from_env({}), ScriptedBackend(lambda q: [0.0]), MODEL
    ).start()
    assert (
        value(registry, "vllm:decision_calibration_temperature", scope="server") == 1.0
    )
    assert (
        value(
            registry,
            "vllm:decision_calibration_temperature_source",
            scope="server",
            source="default",
        )
        == 1
    )

    calibrated = Temperatures(
        Temperature(1.7, "calibrated", "server"),
        {"choice": Temperature(2.5, "calibrated", "choice")},
    )
    metrics.record_temperatures(calibrated)
    assert (
        value(registry, "vllm:decision_calibration_temperature", scope="server") == 1.7
    )
    assert (
        value(registry, "vllm:decision_calibration_temperature", scope="choice") == 2.5
    )
    for scope in ("server", "choice"):
        sources = {
            s: value(
                registry,
                "vllm:decision_calibration_temperature_source",
                scope=scope,
                source=s,
            )
            for s in metrics.TEMPERATURE_SOURCES
        }
        assert sources == {"configured": 0, "calibrated": 1, "default": 0}


async def test_engine_reads_are_timed_by_kind_and_phase(registry):
    with metrics.engine_read("exact"):
        pass
    with pytest.raises(RuntimeError), metrics.engine_read("exact"):
        raise RuntimeError("a read that fails is not timed")

    async def handler(request):
        with metrics.engine_read("top_k"):
            await asyncio.sleep(0)
        return httpx.Response(200)

    await metrics.observed_route("/v1/decisions", handler)(None)
    startup = {"kind": "exact", "phase": "startup"}
    assert (
        value(registry, "vllm:decision_engine_read_latency_seconds_count", **startup)
        == 1
    )
    assert (
        value(
            registry,
            "vllm:decision_engine_read_latency_seconds_count",
            kind="top_k",
            phase="request",
        )
        == 1
    )
    # The handler made no decision: a 2xx then means the client left.
    assert (
        value(
            registry,
            "vllm:decision_requests_total",
            endpoint="/v1/decisions",
            outcome="cancelled",
        )
        == 1
    )


async def test_an_exception_past_the_route_is_an_internal_error(registry):
    async def broken(request):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        await metrics.observed_route("/v1/decisions", broken)(None)
    assert (
        value(
            registry,
            "vllm:decision_requests_total",
            endpoint="/v1/decisions",
            outcome="server_error",
        )
        == 1
    )
    assert (
        value(
            registry,
            "vllm:decision_refusals_total",
            endpoint="/v1/decisions",
            level="request",
            reason="internal_error",
        )
        == 1
    )


def test_init_again_replaces_the_metrics(registry):
    metrics.init_metrics(MODEL, registry)  # no "Duplicated timeseries"
    assert (
        value(
            registry,
            "vllm:decision_requests_total",
            endpoint="/v1/decisions",
            outcome="ok",
        )
        == 0
    )


async def test_requests_through_the_routes_are_counted_per_endpoint(registry):
    app = FastAPI()
    register_decisions_api_router(app)
    backend = ScriptedBackend(lambda q: [-0.2 - i / 2 for i in range(len(q.options))])
    settings = Settings.from_env({"VLLM_TYPED_DECISIONS_MAX_CHOICES": "3"})
    app.state.decision_service = service = DecisionService(settings, backend, MODEL)
    openai = {
        "model": "m",
        "input": "s",
        "questions": [{"type": "predicate", "instructions": "Urgent?"}],
    }
    jev = {
        "state": "s",
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which?",
                "criteria": {"a": None, "b": None},
            }
        },
    }
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://unit"
    ) as client:
        assert (
            await client.post("/v1/decisions", json=openai)
        ).status_code == 503  # not started yet
        await service.start()
        assert (await client.post("/v1/decisions", json=openai)).status_code == 200
        assert (await client.post("/v1/systemone", json=jev)).status_code == 200
        assert (await client.post("/api/alpha/decisions", json=jev)).status_code == 200
        over = {
            **jev,
            "questions": {
                "team": {**jev["questions"]["team"], "criteria": dict.fromkeys("abcd")}
            },
        }
        assert (await client.post("/v1/systemone", json=over)).status_code == 422
        assert (
            await client.post("/v1/decisions", json={"model": "m"})
        ).status_code == 400

    def requests(endpoint: str, outcome: str) -> float:
        return value(
            registry, "vllm:decision_requests_total", endpoint=endpoint, outcome=outcome
        )

    def refusals(endpoint: str, reason: str) -> float:
        return value(
            registry,
            "vllm:decision_refusals_total",
            endpoint=endpoint,
            level="request",
            reason=reason,
        )

    assert [requests(e, "ok") for e in metrics.ENDPOINTS] == [1, 1, 1]
    assert (
        requests("/v1/decisions", "unavailable") == 1
        and refusals("/v1/decisions", "not_ready") == 1
    )
    assert (
        requests("/v1/decisions", "client_error") == 1
        and refusals("/v1/decisions", "invalid_request") == 1
    )
    assert (
        requests("/v1/systemone", "client_error") == 1
        and refusals("/v1/systemone", "over_limit") == 1
    )
    choice_ = {
        "question_type": "choice",
        "backend": "scripted",
        "readout": "direct",
        "outcome": "answered",
    }
    assert (
        value(
            registry,
            "vllm:decision_questions_total",
            endpoint="/api/alpha/decisions",
            **choice_,
        )
        == 1
    )
    latency = {"endpoint": "/v1/systemone", "outcome": "ok"}
    assert (
        value(registry, "vllm:decision_request_latency_seconds_count", **latency) == 1
    )


async def test_a_client_that_leaves_is_counted_as_cancelled(registry):
    app = FastAPI()
    register_decisions_api_router(app)
    backend = ScriptedBackend(lambda q: [0.0] * len(q.options), delay=5)
    app.state.decision_service = service = DecisionService(
        Settings.from_env({}), backend, MODEL
    )
    await service.start()
    body = b'{"model": "m", "input": "s", "questions": [{"type": "predicate", "instructions": "Urgent?"}]}'
    messages = iter(
        [
            {"type": "http.request", "body": body, "more_body": False},
            {"type": "http.disconnect"},
        ]
    )
    sent: list[dict] = []

    async def receive() -> dict:
        await asyncio.sleep(0.05)
        return next(messages)

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/decisions",
        "raw_path": b"/v1/decisions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": None,
        "server": ("unit", 80),
    }
    # the read was cancelled, not awaited
    await asyncio.wait_for(app(scope, receive, send), timeout=3)
    assert (
        value(
            registry,
            "vllm:decision_requests_total",
            endpoint="/v1/decisions",
            outcome="cancelled",
        )
        == 1
    )
    assert (
        value(
            registry,
            "vllm:decision_requests_total",
            endpoint="/v1/decisions",
            outcome="server_error",
        )
        == 0
    )


def test_the_calibration_stage_in_force(registry):
    def stages() -> dict[str, float | None]:
        return {
            stage: registry.get_sample_value(
                "vllm:decision_calibration_stage",
                {"model_name": MODEL, "stage": stage, "adapter": ""},
            )
            for stage in ("first_pass", "full")
        }

    metrics.record_temperatures(Temperatures())
    assert stages() == {"first_pass": None, "full": None}, "nothing calibrated"
    metrics.record_temperatures(Temperatures(), stage="first pass")
    assert stages() == {"first_pass": 1, "full": 0}
    metrics.record_temperatures(Temperatures(), stage="full")
    assert stages() == {"first_pass": 0, "full": 1}
    metrics.record_temperatures(Temperatures(), stage="")
    assert stages() == {"first_pass": 0, "full": 0}, "a failed full calibration"
