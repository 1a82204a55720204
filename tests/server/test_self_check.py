"""A model whose next token is not an option letter is refused at startup, with the reason."""

from __future__ import annotations

import httpx
import pytest

from .conftest import VllmServer, running


def decision_status(server: VllmServer) -> bool:
    body = {
        "model": "m",
        "input": "x",
        "questions": [{"type": "predicate", "instructions": "?"}],
    }
    return httpx.post(
        f"{server.url}/v1/decisions", json=body, timeout=30
    ).status_code != 503 or (
        "not an option letter"
        in httpx.post(f"{server.url}/v1/decisions", json=body, timeout=30).text
    )


@pytest.fixture(scope="module")
def refusing_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("refusing") / "vllm-serve.log"
    # logit named explicitly: the example plugin (tests/plugin) would otherwise claim this Qwen2 model.
    env = {"VLLM_ENABLE_TYPED_DECISIONS": "1", "VLLM_TYPED_DECISIONS_BACKEND": "logit"}
    with running("tiny-qwen2-random", log, env, ready=decision_status) as instance:
        yield instance


def test_random_model_is_refused_with_a_503_that_says_why(refusing_server):
    for path, body in (
        (
            "/v1/decisions",
            {
                "model": "m",
                "input": "x",
                "questions": [{"type": "predicate", "instructions": "?"}],
            },
        ),
        (
            "/v1/systemone",
            {"state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}},
        ),
    ):
        response = httpx.post(refusing_server.url + path, json=body, timeout=30)
        assert response.status_code == 503
        assert (
            "not an option letter" in response.text
            and "VLLM_TYPED_DECISIONS_MIN_OPTION_MASS" in response.text
        )
    assert httpx.get(refusing_server.url + "/health", timeout=10).status_code == 200
