"""Both endpoints over HTTP against a real vllm serve with SmolLM2."""

from __future__ import annotations

import pytest
from openai.types import Decision

from .conftest import CONTEXT

STATE = (
    "Ticket: My payouts have been failing for 3 days and I need the money today. " * 12
)

OPENAI_QUESTIONS = [
    {
        "type": "predicate",
        "name": "urgent",
        "instructions": "Does this ticket convey urgency?",
    },
    {
        "type": "choice",
        "name": "team",
        "instructions": "Which team should handle this?",
        "choices": [
            {"value": "billing", "description": "Payments, refunds"},
            {"value": "technical"},
            {"value": False},
        ],
    },
    {
        "type": "score",
        "instructions": "How frustrated is the customer?",
        "levels": [
            {"label": "Calm"},
            {"label": "Frustrated"},
            {"label": "Very angry", "description": "leaving"},
        ],
    },
]
JEV_QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Does this ticket convey urgency?"},
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {"billing": "Payments, refunds", "technical": None},
    },
    "frustration ✨": {
        "type": "score",
        "instructions": "How frustrated is the customer?",
        "criteria": ["Calm", "Frustrated", "Very angry: leaving"],
    },
}


def decide(client, questions, **extra):
    response = client.post(
        "/v1/decisions",
        json={"model": "m", "input": STATE, "questions": questions, **extra},
    )
    assert response.status_code == 200, response.text
    # every raw body is a valid OpenAI Decision
    Decision.model_validate(response.json())
    return response.json()


def test_openai_endpoint_answers_every_type(client, server):
    body = decide(client, OPENAI_QUESTIONS)
    urgent, team, score = body["answers"]
    assert body["model"] == server.model
    assert urgent["type"] == "predicate" and 0 < urgent["probability"] < 1
    assert team["type"] == "choice" and team["choice"] in (
        "billing",
        "technical",
        False,
    )
    assert sum(p["probability"] for p in team["probabilities"]) == pytest.approx(1)
    assert [p["value"] for p in team["probabilities"]] == [
        "billing",
        "technical",
        False,
    ]
    assert score["name"] is None and 0 <= score["score"] <= 2
    for answer in body["answers"]:
        audit = answer["extra"]["audit"]
        # rotate:1, the default
        assert audit["forward_passes"] == 1 and audit["readout"] == "direct"
        assert audit["debias"] == "rotate:1" and len(audit["rotations"]) == 1
        assert audit["option_mass"] > 0.5, (
            "the answer slot should put most next-token mass on the letters"
        )
        assert answer["extra"]["backend"]["name"] == "logit"
    assert body["usage"]["input_tokens"] == sum(
        a["extra"]["audit"]["input_tokens"] for a in body["answers"]
    )


def test_jev_clients_name_the_model_as_they_ship(client, server):
    """``jev-latest`` (the TypeSafe SDK's default) or no ``model`` is the served model; the served name is
    too; any other name is a 404 in Jev's shape, so a typo still fails loudly. On the OpenAI wire vLLM's
    rules hold: ``jev-latest`` is no model of this server."""
    question = {"q": {"type": "noul", "instructions": "Is this urgent?"}}
    for named in ({"model": "jev-latest"}, {}, {"model": server.model}):
        response = client.post(
            "/v1/systemone", json={**named, "state": STATE, "questions": question}
        )
        assert response.status_code == 200, (named, response.text)
        assert response.json()["model"] == server.model
    typo = client.post(
        "/v1/systemone",
        json={"model": "jev-latset", "state": STATE, "questions": question},
    )
    assert (
        typo.status_code == 404
        and typo.json()["detail"]["error_type"] == "not_found_error"
    ), typo.text
    openai_body = {
        "model": "jev-latest",
        "input": STATE,
        "questions": [{"type": "predicate", "instructions": "?"}],
    }
    assert client.post("/v1/decisions", json=openai_body).status_code == 404


def test_systemone_endpoint_answers_every_type(client, server):
    response = client.post(
        "/v1/systemone",
        json={"model": "jev-latest", "state": STATE, "questions": JEV_QUESTIONS},
    )
    assert response.status_code == 200, response.text
    assert float(response.headers["x-decision-latency-ms"]) > 0
    body = response.json()
    assert body["model"] == server.model and body["id"].startswith("systemone-")
    assert list(body["answers"]) == list(JEV_QUESTIONS)
    urgent, team, frustration = body["answers"].values()
    assert 0 < urgent["noul"] < 1
    assert team["choice"] in ("billing", "technical") and set(
        team["probabilities"]
    ) == {"billing", "technical"}
    assert frustration["legend"] == {
        "0": "Calm",
        "1": "Frustrated",
        "2": "Very angry: leaving",
    }
    assert body["usage"]["output_tokens"] == 3 and "partial_failures" not in body


# Jev's conformance range is 2 to 255 options. With descriptions of a few words, 255 of them render to
# about 4,600 prompt tokens: refused at --max-model-len 4096, answered in SmolLM2's full context.
WIDE_CRITERIA = {
    f"category_{i:03d}": f"Tickets about topic number {i}" for i in range(255)
}


def test_255_options_with_short_descriptions_are_answered(client):
    question = {
        "type": "choice",
        "instructions": "Which category fits this ticket best?",
        "criteria": WIDE_CRITERIA,
    }
    # One reading: the rotations would read the same prompt length again, at 10 s to minutes each on CPU.
    body = {
        "state": "Ticket: my payouts keep failing.",
        "questions": {"topic": question},
        "extra": {"debias": "off"},
    }
    # minutes on a CPU without AVX-512
    response = client.post("/v1/systemone", json=body, timeout=900)
    assert response.status_code == 200, response.text
    answer, usage = response.json()["answers"]["topic"], response.json()["usage"]
    assert (
        list(answer["probabilities"]) == list(WIDE_CRITERIA)
        and answer["choice"] in WIDE_CRITERIA
    )
    assert sum(answer["probabilities"].values()) == pytest.approx(1)
    assert 4096 < usage["input_tokens"] < CONTEXT["smollm2-135m-instruct"]


def test_later_questions_about_one_state_read_it_from_the_prefix_cache(client):
    questions = [
        {"type": "predicate", "instructions": f"Question {i}: is the customer {w}?"}
        for i, w in enumerate(["angry", "polite", "a business", "new"])
    ]
    body = decide(client, questions, extra={"detail": "full"})
    audits = [a["extra"]["audit"] for a in body["answers"]]
    state_tokens = min(a["input_tokens"] for a in audits) - 80
    assert any(a["cached_input_tokens"] >= state_tokens for a in audits[1:]), audits
    usage = body["usage"]
    assert (
        usage["input_tokens_details"]["cached_tokens"]
        == sum(a["cached_input_tokens"] for a in audits)
        > 0
    )


def test_same_question_same_probabilities_on_both_endpoints(client):
    openai_body = decide(
        client,
        OPENAI_QUESTIONS[:2]
        + [
            {
                **OPENAI_QUESTIONS[2],
                "levels": [
                    {"label": "Calm"},
                    {"label": "Frustrated"},
                    {"label": "Very angry: leaving"},
                ],
            }
        ],
    )
    jev_body = client.post(
        "/v1/systemone",
        json={
            "state": STATE,
            "questions": {
                "urgent": JEV_QUESTIONS["urgent"],
                "team": {
                    **JEV_QUESTIONS["team"],
                    "criteria": {
                        "billing": "Payments, refunds",
                        "technical": None,
                        "false": None,
                    },
                },
                "frustration": JEV_QUESTIONS["frustration ✨"],
            },
        },
    ).json()
    urgent, team, score = openai_body["answers"]
    jev = jev_body["answers"]
    assert urgent["probability"] == pytest.approx(jev["urgent"]["noul"], abs=1e-6)
    # A boolean false and the string "false" render alike, so the model sees the same prompt.
    assert [p["probability"] for p in team["probabilities"]] == pytest.approx(
        list(jev["team"]["probabilities"].values()), abs=1e-6
    )
    assert score["score"] == pytest.approx(jev["frustration"]["score"], abs=1e-6)


# A question whose prompt is longer than the server's context (--max-model-len 8192): refused, not cut.
SERVED_CONTEXT = f"--max-model-len {CONTEXT['smollm2-135m-instruct']}"
TOO_LONG = "Is any of this relevant? " + "word " * (
    CONTEXT["smollm2-135m-instruct"] + 50
)


def test_a_refusal_sits_beside_good_answers(client):
    body = decide(
        client,
        [
            OPENAI_QUESTIONS[0],
            {"type": "predicate", "name": "long", "instructions": TOO_LONG},
        ],
    )
    assert body["answers"][0]["type"] == "predicate"
    assert body["answers"][1] == {
        "type": "refusal",
        "name": "long",
        "extra": {"error": body["answers"][1]["extra"]["error"]},
    }
    assert SERVED_CONTEXT in body["answers"][1]["extra"]["error"]


def test_when_every_question_fails_the_request_fails(client):
    long_question = {"type": "predicate", "instructions": TOO_LONG}
    response = client.post(
        "/v1/decisions", json={"model": "m", "input": "x", "questions": [long_question]}
    )
    assert response.status_code == 400
    assert SERVED_CONTEXT in response.json()["error"]["message"]
    jev = client.post(
        "/v1/systemone",
        json={
            "state": "x",
            "questions": {"q": {"type": "noul", "instructions": TOO_LONG}},
        },
    )
    assert jev.status_code == 422 and SERVED_CONTEXT in jev.json()["detail"][0]["msg"]


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/decisions", b"{not json", 400, "JSON"),
        ("/v1/decisions", {"model": "m", "input": "x"}, 400, "questions"),
        (
            "/v1/decisions",
            {"model": "m", "input": "x", "questions": [{"type": "predicate"}]},
            400,
            "instructions",
        ),
        (
            "/v1/decisions",
            {
                "model": "m",
                "input": "x",
                "questions": [{"type": "predicate", "instructions": "x"}] * 17,
            },
            400,
            "VLLM_TYPED_DECISIONS_MAX_QUESTIONS",
        ),
        ("/v1/systemone", b"[1, 2", 422, "JSON"),
        (
            "/v1/systemone",
            {"state": "x", "questions": {"q": {"type": "noul", "instrucions": "x"}}},
            422,
            "instrucions",
        ),
        ("/v1/systemone", {"state": "x", "questions": {}}, 422, "questions"),
        ("/api/alpha/decisions", {"state": "x"}, 422, "questions"),
    ],
)
def test_malformed_requests_get_a_clear_4xx(client, path, body, status, needle):
    kwargs = (
        {"content": body, "headers": {"content-type": "application/json"}}
        if isinstance(body, bytes)
        else {"json": body}
    )
    response = client.post(path, **kwargs)
    assert response.status_code == status, response.text
    assert needle in response.text
    if status == 422:
        assert all({"loc", "msg", "type"} <= set(d) for d in response.json()["detail"])
    else:
        assert response.json()["error"]["code"] == 400
