"""With --api-key, every decision path requires it (Bearer), /api/alpha/decisions included."""

from __future__ import annotations

import httpx
import openai
import pytest
import typesafe_sdk

from .conftest import TINY_QWEN_KEY

KEY = TINY_QWEN_KEY


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
