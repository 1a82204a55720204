"""Fuzzing both endpoints in process: thousands of requests generated from the app's own OpenAPI
schema, each also sent with one mistake, and hostile raw bodies, through the real routes, body
handling, wires and service (a scripted backend stands in for the model). No 5xx; every 4xx says
what is wrong, naming a field or a setting; every 200 is well formed.

A case that once failed goes into tests/fuzz_corpus/ (the failing assertion prints it in that
format) and is replayed here and against the real server (tests/server/test_fuzz.py) for good.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.http.api_router import (
    register_decisions_api_router,
)

from ..fuzzing import CORPUS, corpus_cases, generated_cases, judge, request_schema
from .fakes import ScriptedBackend


def app_with_scripted_model() -> FastAPI:
    app = FastAPI()
    register_decisions_api_router(app)
    backend = ScriptedBackend(
        lambda q: [-0.2 - (i % 3) / 2 for i in range(len(q.options))]
    )
    service = DecisionService(Settings.from_env({}), backend, "scripted-model")
    asyncio.run(service.start())
    app.state.decision_service = service
    return app


@pytest.fixture(scope="module")
def app():
    return app_with_scripted_model()


async def run(app: FastAPI, cases) -> list[str]:
    problems = []
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://fuzz", timeout=60
    ) as client:
        for path, body in cases:
            response = await client.post(
                path, content=body, headers={"content-type": "application/json"}
            )
            if (problem := judge(path, body, response)) is not None:
                problems.append(problem)
    return problems


@pytest.mark.parametrize("path", ["/v1/decisions", "/v1/systemone"])
def test_generated_requests(app, path):
    schema = request_schema(app.openapi(), path)
    cases = list(generated_cases(schema, path, count=1500, seed=7))
    problems = asyncio.run(run(app, cases))
    assert not problems, (
        f"{len(problems)} of {len(cases)} cases failed; first ones:\n"
        + "\n".join(problems[:5])
    )


def test_corpus_of_cases_that_once_failed(app):
    cases = list(corpus_cases())
    assert len(cases) >= len(list(CORPUS.glob("*.json")))
    problems = asyncio.run(run(app, cases))
    assert not problems, "\n".join(problems)
