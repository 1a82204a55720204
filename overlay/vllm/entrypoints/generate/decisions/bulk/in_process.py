# SPDX-License-Identifier: Apache-2.0
"""The decision endpoints called in process: each wire's own validation, decision service and error
bodies (wire/handling.py, the code the HTTP route runs), with no server, socket, HTTP client or
simulated HTTP request in between.

For notebooks and pipelines that hold a vLLM engine (``AsyncLLM``) and for ``vllm run-batch``: a
request body in, the status and JSON body the server would have answered out.
"""

from __future__ import annotations

import asyncio
from argparse import Namespace
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from vllm.engine.protocol import EngineClient
from vllm.entrypoints.generate.decisions.decide.errors import (
    DecisionError,
    internal_error,
)
from vllm.entrypoints.generate.decisions.decide.metrics import observed_route
from vllm.entrypoints.generate.decisions.decide.paths import DECISIONS
from vllm.entrypoints.generate.decisions.decide.serving.service import Decides
from vllm.entrypoints.generate.decisions.http.api_router import wire_at
from vllm.entrypoints.generate.decisions.http.wire.body import decode_body, parse_json
from vllm.entrypoints.generate.decisions.http.wire.handling import Reply, new_request_id
from vllm.entrypoints.generate.decisions.runtime.startup import (
    build_service,
    served_model_name,
    start_served,
)
from vllm.entrypoints.openai.models.protocol import BaseModelPath, LoRAModulePath
from vllm.logger import init_logger

logger = init_logger(__name__)


@dataclass(frozen=True)
class Result:
    """One request's answer, as the server would have sent it."""

    status: int
    body: Any  # the JSON body: the decision, or the wire's error body
    request_id: str

    @property
    def ok(self) -> bool:
        return self.status == 200


class Decisions:
    """Decide requests of either wire format in process::

        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model="HuggingFaceTB/SmolLM2-135M-Instruct"))
        decisions = await Decisions.start(engine, served_model="m")
        result = await decisions.decide({"model": "m", "input": "Refund not received after 10 days.",
                                         "questions": [{"type": "predicate", "instructions": "Is it urgent?"}]})
        result.body["answers"][0]["probability"]

    ``VLLM_TYPED_DECISIONS_*`` variables apply as they do to a server.
    """

    def __init__(self, service: Decides) -> None:
        self.service = service

    @classmethod
    async def start(
        cls,
        engine_client: EngineClient,
        served_model: str | None = None,
        args: Namespace | None = None,
        lora_modules: list[LoRAModulePath] | None = None,
    ) -> Decisions:
        """The decision service over ``engine_client``, started as a server's is (the backend's startup
        check, then the saved calibration or a new one, then the same for each LoRA adapter); ``args`` are
        vLLM's frontend arguments when there are some (``vllm run-batch`` passes its own). A request's
        ``model`` names ``served_model`` (else the model's path) or one of ``lora_modules`` (else those of
        ``args``), loaded here as ``vllm serve --lora-modules`` loads them (the engine needs
        ``enable_lora``). Raises if the backend can't serve the model."""
        if args is None:
            args = Namespace(
                model=engine_client.model_config.model,
                served_model_name=served_model and [served_model],
            )
        served = build_service(
            engine_client, args, await serving_models(engine_client, args, lora_modules)
        )
        await start_served(served)
        # an adapter first named later starts before its request is decided
        served.wait_for_start = True
        if served.readiness.failure is not None:
            raise RuntimeError(
                f"decisions are unavailable on this model: {served.readiness.failure}"
            )
        return cls(served)

    async def decide(
        self,
        body: Any,
        url: str = DECISIONS,
        request_id: str | None = None,
        source: bytes | None = None,
    ) -> Result:
        """One request: ``body`` as JSON text or bytes (size-limited and parsed as strictly as the server
        does) or an already-parsed value; ``url`` names the wire format. ``request_id`` (else a new one)
        is the request's one id, as a route's X-Request-Id: its engine reads and its response's id
        derive from it. ``source``: the bytes ``body`` was already parsed from (run-batch: its line);
        ``body`` is then the parsed value whatever its type, and ``source`` is held to the body size
        limit as the server holds a body."""
        wire = wire_at(url)
        request_id = request_id or new_request_id()
        limit = self.service.settings.max_body_bytes

        async def answer(value: Any) -> Reply:
            try:
                if source is not None:
                    decode_body(source, None, limit)
                elif isinstance(value, str | bytes):
                    value = parse_json(
                        decode_body(
                            value.encode() if isinstance(value, str) else value,
                            None,
                            limit,
                        )
                    )
            except DecisionError as exc:
                return wire.refusal(exc)
            try:
                return await wire.answer(lambda: self.service, value, request_id)
            except Exception:
                # a fault: a 500 in the wire's shape, as the route's, not a lost request
                logger.exception("decision %s failed", request_id)
                return wire.refusal(internal_error(request_id))

        # metrics.py: counted and timed as the route is
        reply = await observed_route(url, answer)(body)
        return Result(reply.status_code, reply.json(), request_id)

    async def decide_many(
        self, bodies: Iterable[Any], url: str = DECISIONS, in_flight: int = 64
    ) -> AsyncIterator[Result]:
        """Every body's result, in order, with at most ``in_flight`` requests at the engine at once."""
        window: list[asyncio.Task[Result]] = []
        for body in bodies:
            window.append(asyncio.ensure_future(self.decide(body, url)))
            if len(window) >= in_flight:
                yield await window.pop(0)
        while window:
            yield await window.pop(0)


async def serving_models(
    engine_client: EngineClient,
    args: Namespace,
    lora_modules: list[LoRAModulePath] | None = None,
) -> Any:
    """vLLM's ``OpenAIServingModels`` as ``vllm serve`` builds it from ``args``: the served names and the
    ``--lora-modules`` adapters (or ``lora_modules``), loaded into the engine."""
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels

    names = getattr(args, "served_model_name", None) or [served_model_name(args)]
    paths = [BaseModelPath(name=name, model_path=str(args.model)) for name in names]
    models = OpenAIServingModels(
        engine_client,
        paths,
        lora_modules=lora_modules or getattr(args, "lora_modules", None),
    )
    await models.init_static_loras()
    return models
