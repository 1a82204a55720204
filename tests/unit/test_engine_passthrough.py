"""vLLM's ``cache_salt`` and ``priority`` from either wire to the engine: the wires take them (Jev at the
top level, as vLLM 0.32's own /v1/systemone does, or under ``extra``), every read's context carries
them, and the host hands them to the engine's ``generate`` and ``encode`` as vLLM's own APIs do.
Refusals of bad values are in tests/cases.py (each wire's error shape, before any model work)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI

from vllm.entrypoints.generate.decisions.decide.engine.vllm_host import VllmHost
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.http.api_router import (
    register_decisions_api_router,
)

from ..cases import jev, openai
from .fakes import ScriptedBackend

# Also run on vLLM 0.32 (tools/test.sh's second pass): these touch vLLM's own APIs.
pytestmark = pytest.mark.vllm032

SALT = "tenant-7-Zq3xV0c8mQ"


class RecordingBackend(ScriptedBackend):
    """Scripted scores; keeps each read's context."""

    def __init__(self) -> None:
        super().__init__(
            lambda question: [math.log(0.5**i) for i in range(len(question.options))]
        )
        self.contexts: list[ReadContext] = []

    async def read(self, question, context):
        self.contexts.append(context)
        return await super().read(question, context)


async def app_over(backend: RecordingBackend, priority_scheduling: bool) -> FastAPI:
    backend.host = SimpleNamespace(priority_scheduling=priority_scheduling)  # type: ignore[assignment]
    app = FastAPI()
    register_decisions_api_router(app)
    app.state.decision_service = DecisionService(
        Settings.from_env({}), backend, "served-model"
    )
    await app.state.decision_service.start()
    return app


async def post(app: FastAPI, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://wire"
    ) as client:
        return await client.post(path, json=body)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/decisions", openai(extra={"cache_salt": SALT, "priority": -3})),
        ("/v1/systemone", jev(cache_salt=SALT, priority=-3)),
        ("/v1/systemone", jev(extra={"cache_salt": SALT, "priority": -3})),
    ],
    ids=["openai extra", "jev top level", "jev extra"],
)
async def test_salt_and_priority_reach_every_read(path, body):
    backend = RecordingBackend()
    app = await app_over(backend, priority_scheduling=True)
    response = await post(app, path, body)
    assert response.status_code == 200, response.text
    assert backend.contexts and all(
        c.cache_salt == SALT and c.priority == -3 for c in backend.contexts
    )


async def test_unset_means_vllms_defaults():
    backend = RecordingBackend()
    app = await app_over(backend, priority_scheduling=False)
    for path, body in (
        ("/v1/decisions", openai()),
        ("/v1/systemone", jev(priority=0, instructions="", images=[])),
    ):
        response = await post(app, path, body)
        assert response.status_code == 200, response.text
    assert [(c.cache_salt, c.priority) for c in backend.contexts] == [
        (None, 0),
        (None, 0),
    ]


async def test_priority_refused_before_any_read_without_the_priority_scheduler():
    backend = RecordingBackend()
    app = await app_over(backend, priority_scheduling=False)
    response = await post(app, "/v1/decisions", openai(extra={"priority": 2}))
    assert (
        response.status_code == 400
        and "--scheduling-policy priority" in response.json()["error"]["message"]
    )
    response = await post(app, "/v1/systemone", jev(priority=2))
    assert (
        response.status_code == 422
        and "--scheduling-policy priority" in response.json()["detail"][0]["msg"]
    )
    assert backend.contexts == []


async def test_openapi_lists_the_extensions_not_the_refused_fields():
    app = await app_over(RecordingBackend(), priority_scheduling=False)
    schemas = app.openapi()["components"]["schemas"]
    jev_fields = set(schemas["SystemOneRequest"]["properties"])
    assert {"cache_salt", "priority"} <= jev_fields
    assert not {"instructions", "images", "audio", "videos"} & jev_fields
    assert {"cache_salt", "priority"} <= set(schemas["ExtraRequest"]["properties"])


class FakeEngine:
    """Records what the host asks of the engine; every read returns one log-probability."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object, dict]] = []

    async def generate(self, engine_input, params, request_id, **kwargs):
        self.calls.append(("generate", engine_input, kwargs))
        logprobs = [{5: SimpleNamespace(logprob=-0.25)}]
        yield SimpleNamespace(
            outputs=[SimpleNamespace(logprobs=logprobs, text="A", token_ids=[5])],
            num_cached_tokens=0,
        )

    async def encode(self, engine_input, params, request_id, **kwargs):
        self.calls.append(("encode", engine_input, kwargs))
        yield SimpleNamespace(outputs=SimpleNamespace(data=[[0.5]]))


def bare_host(engine: FakeEngine) -> VllmHost:
    """A VllmHost over ``engine`` without a model: only what its reads use."""
    host = VllmHost.__new__(VllmHost)
    host.engine_client = engine  # type: ignore[assignment]
    host.request_logger = None
    host.adapter = None
    host.replicas = 1
    host.fp32_reads_missing = "no patch"
    return host


@pytest.mark.parametrize(("salt", "priority"), [(SALT, 7), (None, 0)])
async def test_the_host_hands_salt_and_priority_to_the_engine(salt, priority):
    engine = FakeEngine()
    host = bare_host(engine)
    context = ReadContext("state", "0" * 64, "decision-r-0", None, salt, priority)
    await host.read_token_logprobs([1, 2, 3], [5], context)
    await host.read_top_logprobs([1, 2, 3], 5, context.part("k"))
    await host.generate([1, 2, 3], 1, context)
    await host.pool([1, 2, 3], "token_classify", context)
    assert [kind for kind, _, _ in engine.calls] == ["generate"] * 3 + ["encode"]
    for _, engine_input, kwargs in engine.calls:
        assert engine_input["prompt_token_ids"] == [1, 2, 3]
        assert engine_input.get("cache_salt") == salt
        assert kwargs["priority"] == priority


async def test_a_bare_request_id_reads_unsalted_at_priority_zero():
    engine = FakeEngine()
    await bare_host(engine).read_token_logprobs([1], [5], "plugin-read")
    _, engine_input, kwargs = engine.calls[0]
    assert "cache_salt" not in engine_input and kwargs["priority"] == 0


async def test_every_read_goes_through_the_adapter_its_context_or_host_names():
    from vllm.lora.request import LoRARequest

    engine, adapter = FakeEngine(), LoRARequest("judge", 1, "/adapters/judge")
    host = bare_host(engine)
    named = ReadContext("state", "0" * 64, "decision-r-0", None, adapter=adapter)
    await host.read_token_logprobs([1], [5], named)
    await host.generate([1], 1, named)
    await host.pool([1], "token_classify", named)
    bound = host.for_adapter(adapter)
    # a context of its own naming none
    await bound.read_top_logprobs([1], 5, "decision-self-check-0")
    await host.read_token_logprobs([1], [5], "plugin-read")
    assert [kwargs["lora_request"] for _, _, kwargs in engine.calls] == [
        adapter
    ] * 4 + [None]
    assert host.adapter is None, "binding copies the host"
