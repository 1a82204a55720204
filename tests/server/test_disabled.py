"""With VLLM_ENABLE_TYPED_DECISIONS off the server is stock vLLM: no decision routes.

The server sets it empty, the way an env file switches a variable off, which once stopped vLLM at
startup; unset reads the same (tests/unit/test_settings_values.py), so one server covers both."""

from __future__ import annotations

import httpx
import pytest

from .conftest import VllmServer, running


def health(server: VllmServer) -> bool:
    return httpx.get(f"{server.url}/health", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def stock_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("stock") / "vllm-serve.log"
    env = {"VLLM_ENABLE_TYPED_DECISIONS": ""}
    with running("tiny-llama-localtok", log, env, ready=health) as instance:
        yield instance


def test_no_decision_routes_with_the_switch_empty(stock_server):
    for path in ("/v1/decisions", "/v1/systemone", "/api/alpha/decisions"):
        response = httpx.post(f"{stock_server.url}{path}", json={"model": "m"}, timeout=30)
        assert response.status_code == 404, path
    routes = httpx.get(f"{stock_server.url}/openapi.json", timeout=30).json()["paths"]
    assert not [p for p in routes if "decision" in p or "systemone" in p]
    assert "typed decisions" not in stock_server.log.read_text()
