"""With VLLM_ENABLE_TYPED_DECISIONS off the server is stock vLLM: no decision routes of ours, and its own
key check on every path. On vLLM 0.32 that includes its own ``POST /v1/systemone``
(vllm/entrypoints/generate/structured_decisions), which answers there as stock: behind ``--api-key`` too.

The server sets the switch empty, the way an env file switches a variable off, which once stopped vLLM at
startup; unset reads the same (tests/unit/test_settings_values.py), so one server covers both."""

from __future__ import annotations

import httpx
import pytest

import vllm

from .conftest import VllmServer, running

pytestmark = pytest.mark.vllm032
KEY = "stock-key"
UPSTREAM_SYSTEMONE = not vllm.__version__.startswith("0.30.")
JEV_BODY = {
    "state": "The sky is blue.",
    "questions": {"q": {"type": "noul", "instructions": "Is the sky blue?"}},
}


def health(server: VllmServer) -> bool:
    return httpx.get(f"{server.url}/health", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def stock_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("stock") / "vllm-serve.log"
    env = {"VLLM_ENABLE_TYPED_DECISIONS": ""}
    with running(
        "tiny-qwen2-random", log, env, "--api-key", KEY, ready=health
    ) as instance:
        yield instance


def test_no_decision_routes_with_the_switch_empty(stock_server):
    keyed = {"Authorization": f"Bearer {KEY}"}
    for path in ("/v1/decisions", "/api/alpha/decisions") + (
        () if UPSTREAM_SYSTEMONE else ("/v1/systemone",)
    ):
        response = httpx.post(
            f"{stock_server.url}{path}", json={"model": "m"}, headers=keyed, timeout=30
        )
        assert response.status_code == 404, path
    routes = httpx.get(f"{stock_server.url}/openapi.json", timeout=30).json()["paths"]
    ours = [p for p in routes if "decision" in p or "systemone" in p]
    assert ours == (["/v1/systemone"] if UPSTREAM_SYSTEMONE else [])
    assert "typed decisions" not in stock_server.log.read_text()


def test_vllms_key_check_guards_every_v1_path(stock_server):
    for path in ("/v1/decisions", "/v1/systemone"):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = httpx.post(
                f"{stock_server.url}{path}", json=JEV_BODY, headers=headers, timeout=30
            )
            assert (response.status_code, response.json()) == (
                401,
                {"error": "Unauthorized"},
            ), path


@pytest.mark.skipif(
    not UPSTREAM_SYSTEMONE, reason="vLLM 0.30 has no /v1/systemone of its own"
)
def test_upstreams_own_systemone_answers_with_the_key(stock_server):
    """vLLM 0.32's handler, not ours: its operation on /openapi.json, and its answer. It reads only a few
    architectures (Qwen3, Qwen3.5, LFM2-VL, DiffusionGemma, ClefOmni); for this Qwen2 model it says so."""
    operation = httpx.get(f"{stock_server.url}/openapi.json", timeout=30).json()[
        "paths"
    ]["/v1/systemone"]["post"]
    assert operation["operationId"] == "create_structured_decision_v1_systemone_post"
    response = httpx.post(
        f"{stock_server.url}/v1/systemone",
        json=JEV_BODY,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    )
    assert response.status_code == 501, response.text
    assert (
        response.json()["error"]["message"]
        == "The model does not support the structured decision API"
    )
    assert "x-decision-latency-ms" not in response.headers
