"""The decision metrics on vLLM's ``/metrics`` move: a decision on each wire, refusals, and the gauges of the
temperature in force (the shared SmolLM2 server; test_calibration.py checks them over two API-server processes)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .conftest import VllmServer

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def decision_samples(server: VllmServer) -> Samples:
    """Every ``vllm:decision_*`` sample on ``/metrics``, keyed by name and labels."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("vllm:decision_")
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


NOUL = {"type": "noul", "instructions": "Does this ticket convey urgency?"}
OPENAI = {
    "model": "m",
    "input": "Ticket: my payouts have failed for 3 days.",
    "questions": [
        {"type": "predicate", "instructions": "Does this ticket convey urgency?"}
    ],
}
JEV = {
    "state": "Ticket: my payouts have failed for 3 days.",
    "questions": {"urgent": NOUL},
}


def test_decision_metrics_move(server, client):
    before = decision_samples(server)
    for path, body in (
        ("/v1/decisions", OPENAI),
        ("/v1/systemone", JEV),
        ("/api/alpha/decisions", JEV),
    ):
        assert client.post(path, json=body).status_code == 200, path
    too_many = {
        **JEV,
        "questions": {f"q{i}": NOUL for i in range(17)},
    }  # the server's MAX_QUESTIONS is 16
    assert client.post("/v1/systemone", json=too_many).status_code == 422
    assert (
        client.post("/v1/decisions", json={"model": "m", "input": "x"}).status_code
        == 400
    )
    after = decision_samples(server)

    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    model = {"model_name": server.model}
    for endpoint in ("/v1/decisions", "/v1/systemone", "/api/alpha/decisions"):
        assert (
            moved(
                "vllm:decision_requests_total", endpoint=endpoint, outcome="ok", **model
            )
            == 1
        ), endpoint
        assert (
            moved(
                "vllm:decision_request_latency_seconds_count",
                endpoint=endpoint,
                outcome="ok",
            )
            == 1
        )
        # A predicate is a noul question: the label is the question type, not the wire's name for it.
        answered = {
            "endpoint": endpoint,
            "question_type": "noul",
            "backend": "logit",
            "outcome": "answered",
        }
        assert (
            moved("vllm:decision_questions_total", readout="direct", **answered) == 1
        ), endpoint
    assert (
        moved(
            "vllm:decision_requests_total",
            endpoint="/v1/systemone",
            outcome="client_error",
        )
        == 1
    )
    assert (
        moved(
            "vllm:decision_refusals_total",
            endpoint="/v1/systemone",
            level="request",
            reason="over_limit",
        )
        == 1
    )
    assert (
        moved(
            "vllm:decision_refusals_total",
            endpoint="/v1/decisions",
            level="request",
            reason="invalid_request",
        )
        == 1
    )
    assert moved("vllm:decision_option_mass_count", backend="logit") == 3
    assert moved("vllm:decision_option_mass_bucket", backend="logit", le="0.5") == 0, (
        "the self-check wants > 0.5"
    )
    # One read per question (rotate:1, the default); the startup check read before any request.
    assert (
        moved("vllm:decision_engine_read_latency_seconds_count", phase="request") == 3
    )
    assert (
        total(after, "vllm:decision_engine_read_latency_seconds_count", phase="startup")
        > 0
    )
    # Calibration is off on this server: T = 1, the default.
    assert (
        total(after, "vllm:decision_calibration_temperature", scope="server", **model)
        == 1.0
    )
    assert (
        total(
            after,
            "vllm:decision_calibration_temperature_source",
            scope="server",
            source="default",
        )
        == 1
    )
    assert (
        total(
            after,
            "vllm:decision_calibration_temperature_source",
            scope="server",
            source="calibrated",
        )
        == 0
    )
