"""The decision endpoints as a vLLM endpoint plugin: vLLM's protocol, its gating by task, the routes and
the plugin list on the app, and vLLM's own state phase reaching it. The engine path (the decision service
started by init_app_state in serve, --api-server-count and run-batch) is tested on real servers in
tests/server (test_endpoints, test_scale_out, test_bulk)."""

from __future__ import annotations

import asyncio
from argparse import Namespace

from fastapi import FastAPI
from fastapi.routing import APIRoute

from vllm.entrypoints.generate.decisions.http.endpoint_plugin import (
    DecisionsEndpoint,
    attach_decisions,
    decision_plugins,
)
from vllm.plugins.endpoint_plugins.interface import (
    EndpointPlugin,
    init_endpoint_plugins_state,
)


def paths(app: FastAPI) -> list[str]:
    return [route.path for route in app.router.routes if isinstance(route, APIRoute)]


def test_it_is_a_vllm_endpoint_plugin():
    assert isinstance(DecisionsEndpoint(), EndpointPlugin)


def test_it_serves_generative_and_laya_decision_models_only():
    assert [
        len(decision_plugins(tasks))
        for tasks in [
            ("generate",),
            ("token_classify", "embed"),
            ("render",),
            ("embed", "classify"),
            (),
        ]
    ] == [1, 1, 0, 0, 0]


def test_attaching_puts_the_routes_and_the_plugin_on_the_app():
    app = FastAPI()

    @app.get("/v1/models")
    async def vllm_models() -> None: ...

    earlier = object()
    app.state.endpoint_plugins = [earlier]  # what vLLM's build_app attached before
    attach_decisions(app, ("generate",))
    assert {"/v1/decisions", "/v1/systemone", "/api/alpha/decisions"} <= set(paths(app))
    first = app.router.routes[0]
    assert (
        isinstance(first, APIRoute)
        and first.path == "/v1/models"
        and first.endpoint is not vllm_models
    )
    plugins = app.state.endpoint_plugins
    assert plugins[0] is earlier and [type(p) for p in plugins[1:]] == [
        DecisionsEndpoint
    ]


def test_a_server_without_our_tasks_gets_nothing():
    app = FastAPI()
    app.state.endpoint_plugins = []
    attach_decisions(app, ("render",))
    assert paths(app) == [] and app.state.endpoint_plugins == []


def test_vllms_state_phase_reaches_the_plugin_and_an_engineless_server_gets_no_service():
    app = FastAPI()
    attach_decisions(app, ("generate",))
    asyncio.run(init_endpoint_plugins_state(None, app.state, Namespace(model="m")))
    assert not hasattr(app.state, "decision_service")
