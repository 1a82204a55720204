"""The API key on the decision routes, failing closed (auth.py, routing.py), on an app built as vLLM builds
its own: the decision routes, a route of vLLM's beside them and the key middleware. The real server's
check of the same variants over raw sockets is tests/server/test_auth.py."""

from __future__ import annotations

import json
from argparse import Namespace

import httpx
import pytest
from fastapi import FastAPI

from vllm.entrypoints.generate.decisions.decide import paths
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.http.api_router import (
    register_decisions_api_router,
)
from vllm.entrypoints.generate.decisions.http.wire.auth import DecisionAuthentication

from ..fuzzing import path_variants
from .fakes import ScriptedBackend
from .test_wire import JEV_REQUEST, OPENAI_REQUEST, descending

KEY = "secret"


@pytest.fixture
async def app():
    service = DecisionService(
        Settings.from_env({}), ScriptedBackend(descending), "served-model"
    )
    await service.start()
    app = FastAPI()
    register_decisions_api_router(app)
    app.state.decision_service = service
    app.state.args = Namespace(api_key=[KEY])
    app.add_middleware(DecisionAuthentication, tokens=[KEY])
    return app


def body_for(path: str) -> bytes:
    return json.dumps(
        OPENAI_REQUEST if path == paths.DECISIONS else JEV_REQUEST
    ).encode()


async def post(
    app: FastAPI, target: str, path: str, key: str | None = None, method: str = "POST"
):
    headers = {
        "Content-Type": "application/json",
        **({"Authorization": f"Bearer {key}"} if key else {}),
    }
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://auth"
    ) as client:
        return await client.request(
            method, target, content=body_for(path), headers=headers
        )


@pytest.mark.parametrize("path", paths.DECISION_PATHS)
async def test_no_spelling_of_a_decision_path_answers_without_the_key(app, path):
    for target in path_variants(path):
        for method in ("POST", "GET", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"):
            response = await post(app, target, path, method=method)
            # vLLM lets OPTIONS (CORS preflights) past the key: at most a redirect to the path as written.
            refused = (401, 404, 405, 307) if method == "OPTIONS" else (401, 404, 405)
            assert response.status_code in refused, (
                method,
                target,
                response.status_code,
            )
            assert b"answers" not in response.content, (method, target)
    # The key unlocks the path as it is written, and only that.
    assert (await post(app, path, path, KEY)).status_code == 200
    assert (await post(app, path + "%0A", path, KEY)).status_code == 404


async def test_a_decision_route_refuses_without_the_middlewares_verdict(app):
    """Were the middleware missing or skipping a request, the route refuses it itself."""
    app.user_middleware.clear()
    for path in paths.DECISION_PATHS:
        assert (await post(app, path, path, KEY)).status_code == 401
    # a server without a key answers without one
    app.state.args = Namespace(api_key=None)
    assert (
        await post(app, paths.SYSTEMONE_ALPHA, paths.SYSTEMONE_ALPHA)
    ).status_code == 200
