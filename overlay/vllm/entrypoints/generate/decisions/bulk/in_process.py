# SPDX-License-Identifier: Apache-2.0
"""The decision endpoints called in process, for notebooks, pipelines and ``vllm run-batch``: each
wire's own handling (handling.py, as the route runs it) with no server or simulated HTTP request in
between; a request body in, the status and JSON body the server would have answered out."""

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
    """Decide requests of either wire format in process (docs/bulk.md); ``VLLM_TYPED_DECISIONS_*``
    variables apply as they do to a server."""

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
        """The decision service over ``engine_client``, started as a server's is; ``args``: vLLM's
        frontend arguments if any (run-batch's). Models are ``served_model`` (else the model's path) and
        ``lora_modules`` (else ``args``'s; the engine needs ``enable_lora``)."""
        if args is None:
            args = Namespace(
                model=engine_client.model_config.model,
                served_model_name=served_model and [served_model],
            )
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels

        # vLLM's model list as ``vllm serve`` builds it from ``args``, adapters loaded
        names = getattr(args, "served_model_name", None) or [served_model_name(args)]
        paths = [BaseModelPath(name=name, model_path=str(args.model)) for name in names]
        lora_modules = lora_modules or getattr(args, "lora_modules", None)
        models = OpenAIServingModels(engine_client, paths, lora_modules=lora_modules)
        await models.init_static_loras()
        served = build_service(engine_client, args, models)
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
        """One request: ``body`` as JSON text or bytes (limited and parsed as the server does) or a parsed
        value; ``url`` names the wire. ``source``: the bytes ``body`` was parsed from (run-batch's line),
        then only held to the body size limit."""
        wire = wire_at(url)
        request_id = request_id or new_request_id()
        limit = self.service.settings.max_body_bytes

        async def answer(value: Any) -> Reply:
            try:
                if source is not None:
                    decode_body(source, None, limit)
                elif isinstance(value, str | bytes):
                    raw = value.encode() if isinstance(value, str) else value
                    value = parse_json(decode_body(raw, None, limit))
            except DecisionError as exc:
                return wire.refusal(exc)
            try:
                return await wire.answer(lambda: self.service, value, request_id)
            except Exception:
                # a fault: a 500 in the wire's shape, as the route's, not a lost request
                logger.exception("decision %s failed", request_id)
                return wire.refusal(internal_error(request_id))

        # counted and timed as the route is
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
