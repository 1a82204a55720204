"""Issue 3's wire contract over HTTP: every invalid request gets the right 4xx, input forms,
compressed bodies, /v1/models for both SDKs, Authorization handling."""

from __future__ import annotations

import gzip
import json
import uuid

import httpx2
import openai
import pytest
import typesafe_sdk
from backports import zstd

from ..cases import JEV_INVALID, OPENAI_INVALID
from .conftest import CONTEXT


def post(client, path, body):
    if isinstance(body, (dict, list, str)) and not isinstance(body, bytes):
        return client.post(path, json=body)
    return client.post(path, content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    ("body", "needle"),
    [c[1:] for c in OPENAI_INVALID],
    ids=[c[0] for c in OPENAI_INVALID],
)
def test_openai_invalid_request(client, body, needle):
    response = post(client, "/v1/decisions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError"
    assert needle in error["message"]


@pytest.mark.parametrize(
    ("body", "needle"), [c[1:] for c in JEV_INVALID], ids=[c[0] for c in JEV_INVALID]
)
@pytest.mark.parametrize("path", ["/v1/systemone", "/api/alpha/decisions"])
def test_jev_invalid_request(client, path, body, needle):
    response = post(client, path, body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert all(
        {"loc", "msg", "type"} <= set(d) and d["loc"][0] == "body" for d in detail
    )
    assert needle in json.dumps(detail, ensure_ascii=False)


def test_input_items_and_json_parts_are_answered(client):
    data = {"ticket": "payouts failing", "days": 3}
    items = [
        {"role": "system", "content": "Support ticket triage."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Ticket below."},
                {"type": "input_json", "data": data},
            ],
        },
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "lookup",
            "arguments": '{"id": 7}',
        },
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "plan: pro"}],
        },
        {
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Looking into it."}],
        },
    ]
    body = {
        "model": "m",
        "input": items,
        "questions": [
            {
                "type": "predicate",
                "instructions": [{"type": "input_text", "text": "Is it urgent?"}],
            }
        ],
    }
    response = client.post("/v1/decisions", json=body)
    assert response.status_code == 200, response.text
    assert 0 < response.json()["answers"][0]["probability"] < 1


def test_json_input_and_jev_json_state_read_the_same(client):
    data = {"ticket": "payouts failing", "priority": "high"}
    question = {"type": "predicate", "instructions": "Is this urgent?"}
    openai_body = client.post(
        "/v1/decisions",
        json={
            "model": "m",
            "questions": [question],
            "input": [
                {"role": "user", "content": [{"type": "input_json", "data": data}]}
            ],
        },
    ).json()
    jev_body = client.post(
        "/v1/systemone",
        json={
            "state": data,
            "questions": {"q": {"type": "noul", "instructions": "Is this urgent?"}},
        },
    ).json()
    assert openai_body["answers"][0]["probability"] == pytest.approx(
        jev_body["answers"]["q"]["noul"], abs=1e-6
    )


def test_jev_detail_none_leaves_only_jev_fields(client):
    body = {
        "state": "x",
        "extra": {"detail": "none"},
        "questions": {
            "a": {"type": "noul", "criteria": {"true": "yes", "false": None}},
            "b": {
                "type": "choice",
                "instructions": {"ask": "which"},
                "criteria": {"x": {"note": 1}, "y": None},
            },
            "c": {"type": "score", "criteria": ["low", "high"]},
        },
    }
    answers = client.post("/v1/systemone", json=body).json()["answers"]
    assert set(answers["a"]) == {"type", "noul"}
    assert set(answers["b"]) == {"type", "choice", "probabilities", "confidence"}
    assert set(answers["c"]) == {
        "type",
        "score",
        "confidence",
        "legend",
        "probabilities",
    }


def test_question_ids_and_option_names_round_trip(client):
    ids = ["urgent 🚨", "", "a.b[0]", "日本語", " spaced  "]
    names = {"billing ✓": None, "tech\nsupport": "bugs", '"quoted"': None}
    questions = {i: {"type": "choice", "criteria": names} for i in ids}
    raw = client.post(
        "/v1/systemone", json={"state": "s", "questions": questions}
    ).content
    body = json.loads(raw)
    assert list(body["answers"]) == ids
    for answer in body["answers"].values():
        assert (
            list(answer["probabilities"]) == list(names) and answer["choice"] in names
        )


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_compressed_bodies(client, encoding):
    body = json.dumps(
        {
            "state": "Ticket: " + "payouts failing. " * 100,
            "questions": {"q": {"type": "noul", "instructions": "Urgent?"}},
        }
    ).encode()
    data = gzip.compress(body) if encoding == "gzip" else zstd.compress(body)
    response = client.post(
        "/v1/systemone",
        content=data,
        headers={"content-type": "application/json", "content-encoding": encoding},
    )
    assert response.status_code == 200, response.text
    assert 0 < response.json()["answers"]["q"]["noul"] < 1


def test_unknown_content_encoding_is_refused(client):
    response = client.post(
        "/v1/decisions",
        content=b"{}",
        headers={"content-type": "application/json", "content-encoding": "br"},
    )
    assert response.status_code == 415 and "br" in response.json()["error"]["message"]


def test_typesafe_sdk_sends_zstd_bodies(server):
    sent = []
    client = typesafe_sdk.TypeSafeClient(
        api_key="unused",
        base_url=server.url,
        compression="zstd",
        http_client=httpx2.Client(event_hooks={"request": [sent.append]}),
    )
    response = client.system_one(
        "Ticket: " + "payouts failing. " * 200,
        {"q": typesafe_sdk.Noul(instructions="Urgent?")},
    )
    assert 0 < response.answers["q"].noul < 1
    assert sent and sent[-1].headers.get("content-encoding") == "zstd"


def test_models_list_parses_in_both_sdks(server):
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in oai.models.list()] == [server.model]
    listing = typesafe_sdk.TypeSafeClient(
        api_key="unused", base_url=server.url
    ).models.list()
    assert [m.name for m in listing.models] == [server.model]


def test_authorization_header_is_ignored_without_api_key(client):
    body = {"state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}
    openai_body = {
        "model": "m",
        "input": "x",
        "questions": [{"type": "predicate", "instructions": "?"}],
    }
    for path, sent in (
        ("/v1/systemone", body),
        ("/api/alpha/decisions", body),
        ("/v1/decisions", openai_body),
    ):
        for header in ("Bearer whatever", "Basic Zm9vOmJhcg==", ""):
            response = client.post(path, json=sent, headers={"Authorization": header})
            assert response.status_code == 200, response.text


def test_refusal_beside_good_answers_in_the_openai_sdk(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    decision = client.decisions.create(
        model="m",
        input="Ticket.",
        questions=[
            {"type": "predicate", "name": "ok", "instructions": "Urgent?"},
            {
                "type": "predicate",
                "name": "wide",
                "instructions": "Relevant? "
                + "word " * (CONTEXT["smollm2-135m-instruct"] + 50),
            },
        ],
    )
    ok, wide = decision.answers
    assert ok.type == "predicate" and wide.type == "refusal" and wide.name == "wide"
    assert "--max-model-len" in wide.model_extra["extra"]["error"]


def test_unreachable_is_not_a_5xx(client):
    # A body that is valid JSON but the wrong shape everywhere still gets a 4xx, never a 5xx.
    for body in (
        None,
        1,
        "x",
        [],
        {"questions": None},
        {"input": {}, "model": 1, "questions": [None]},
    ):
        for path in ("/v1/decisions", "/v1/systemone"):
            response = client.post(path, json=body)
            assert 400 <= response.status_code < 500, (path, body, response.text)


def test_size_limits_are_settings_named_in_the_refusal(client):
    """Body over VLLM_TYPED_DECISIONS_MAX_BODY_BYTES (4 MiB): 413; input over MAX_INPUT_CHARS: 400/422.
    Both before any model work, both naming the setting."""
    big = b'{"model": "m", "input": "' + b"x" * (5 * 2**20) + b'", "questions": []}'
    response = client.post(
        "/v1/decisions", content=big, headers={"content-type": "application/json"}
    )
    assert (
        response.status_code == 413
        and "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES" in response.text
    )
    long_input = "word " * 250_000  # 1,250,000 characters, over the default 1,000,000
    openai_body = {
        "model": "m",
        "input": long_input,
        "questions": [{"type": "predicate", "instructions": "?"}],
    }
    response = client.post("/v1/decisions", json=openai_body)
    assert (
        response.status_code == 400
        and "VLLM_TYPED_DECISIONS_MAX_INPUT_CHARS" in response.text
    )
    jev_body = {
        "state": long_input,
        "questions": {"q": {"type": "noul", "instructions": "?"}},
    }
    response = client.post("/v1/systemone", json=jev_body)
    assert (
        response.status_code == 422
        and "VLLM_TYPED_DECISIONS_MAX_INPUT_CHARS" in response.text
    )


def test_cache_salt_keeps_prefix_cache_blocks_apart(client):
    """vLLM's cache_salt reaches the engine from both wires: a read shares prefix-cache blocks only with
    reads under the same salt (a fresh salt shares none, not even the chat template's opening)."""
    state = (
        f"Ticket {uuid.uuid4().hex}: payouts have failed for three days and the customer is upset. "
        * 3
    )
    question = {"type": "noul", "instructions": "Is it urgent?"}
    plain = {"debias": "off", "prior": "off"}
    salt_a, salt_b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"

    def cached(path: str, body: dict) -> int:
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        answers = response.json()["answers"]
        answer = (
            answers[0] if isinstance(answers, list) else next(iter(answers.values()))
        )
        return answer["extra"]["audit"]["cached_input_tokens"]

    def jev_body(**fields):
        return {"state": state, "questions": {"q": question}, **fields}

    assert cached("/v1/systemone", jev_body(cache_salt=salt_a, extra=plain)) == 0
    assert cached("/v1/systemone", jev_body(cache_salt=salt_a, extra=plain)) > 0
    assert cached("/v1/systemone", jev_body(extra={**plain, "cache_salt": salt_b})) == 0
    # The same question on /v1/decisions renders the same prompt: it shares salt b's blocks.
    openai_body = {
        "model": "m",
        "input": state,
        "questions": [{"type": "predicate", "instructions": "Is it urgent?"}],
        "extra": {**plain, "cache_salt": salt_b},
    }
    assert cached("/v1/decisions", openai_body) > 0


def test_priority_zero_is_answered_on_a_first_come_server(client):
    body = {
        "state": "Ticket: payouts failing.",
        "questions": {"q": {"type": "noul", "instructions": "Urgent?"}},
    }
    assert client.post("/v1/systemone", json={**body, "priority": 0}).status_code == 200
