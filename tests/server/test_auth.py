"""With --api-key, every decision path requires it (Bearer), /api/alpha/decisions included; and with
decisions on, ``/v1/systemone`` is ours on every vLLM version, though vLLM 0.32 serves one of its own
(the route is taken over; test_disabled.py checks upstream's with decisions off). Runs on vLLM 0.30 and,
in tools/test.sh's second pass, on 0.32."""

from __future__ import annotations

import httpx
import openai
import pytest
import typesafe_sdk

from .conftest import TINY_QWEN_KEY

KEY = TINY_QWEN_KEY
pytestmark = pytest.mark.vllm032


@pytest.fixture(scope="module")
def keyed_server(tiny_qwen_server):
    return tiny_qwen_server


BODIES = {
    "/v1/decisions": {"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "?"}]},
    "/v1/systemone": {"state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}},
    "/api/alpha/decisions": {"state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}},
}


@pytest.mark.parametrize("path", list(BODIES))
def test_key_required_on_every_decision_path(keyed_server, path):
    url = keyed_server.url + path
    assert httpx.post(url, json=BODIES[path], timeout=60).status_code == 401
    wrong = httpx.post(url, json=BODIES[path], headers={"Authorization": "Bearer nope"}, timeout=60)
    assert wrong.status_code == 401
    right = httpx.post(url, json=BODIES[path], headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert right.status_code == 200, right.text
    # A bad body without the key says nothing about the body: the key is checked first.
    assert httpx.post(url, content=b"{not json", timeout=60).status_code == 401


def test_sdks_send_the_key(keyed_server):
    oai = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=KEY, max_retries=0)
    assert oai.decisions.create(model="m", input="x", questions=[{"type": "predicate", "instructions": "?"}]).answers
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key="bad", max_retries=0).decisions.create(
            model="m", input="x", questions=[{"type": "predicate", "instructions": "?"}]
        )
    ts = typesafe_sdk.TypeSafeClient(api_key=KEY, base_url=keyed_server.url)
    assert ts.system_one("x", {"q": typesafe_sdk.Noul(instructions="?")}).answers["q"].noul >= 0
    with pytest.raises(typesafe_sdk.TypeSafeAuthenticationError):
        typesafe_sdk.TypeSafeClient(api_key="bad", base_url=keyed_server.url).system_one(
            "x", {"q": typesafe_sdk.Noul(instructions="?")}
        )


def test_systemone_is_ours_with_the_same_probabilities_as_decisions(keyed_server):
    """One operation per decision path on /openapi.json, ours (not vLLM 0.32's
    ``create_structured_decision``), and one question read alike on both wires."""
    paths = httpx.get(f"{keyed_server.url}/openapi.json", timeout=30).json()["paths"]
    for path in BODIES:
        assert list(paths[path]) == ["post"] and "structured_decision" not in paths[path]["post"]["operationId"]
    keyed = {"Authorization": f"Bearer {KEY}"}
    question = "Does the customer ask for a refund?"
    state = "I was charged twice for my order and want my money back."
    openai_answer = httpx.post(f"{keyed_server.url}/v1/decisions", headers=keyed, timeout=60, json={
        "model": "m", "input": state, "questions": [{"type": "predicate", "instructions": question}]})  # fmt: skip
    jev_answer = httpx.post(f"{keyed_server.url}/v1/systemone", headers=keyed, timeout=60, json={
        "state": state, "questions": {"refund": {"type": "noul", "instructions": question}}})  # fmt: skip
    assert openai_answer.status_code == jev_answer.status_code == 200, (openai_answer.text, jev_answer.text)
    assert "x-decision-latency-ms" in jev_answer.headers
    probability = openai_answer.json()["answers"][0]["probability"]
    assert probability == pytest.approx(jev_answer.json()["answers"]["refund"]["noul"], abs=1e-6)
