# SPDX-License-Identifier: Apache-2.0
"""Which service answers a request: its ``model`` resolved by vLLM's own code, as its endpoints do,
and a decision service per LoRA adapter (an adapter changes the answers, so it has its own
calibration). At most VLLM_TYPED_DECISIONS_MAX_ADAPTERS are held, so a client naming adapters can't
make the server hold (or calibrate) without bound."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from vllm.entrypoints.generate.decisions.decide.errors import (
    DecisionError,
    NotReadyError,
    shown,
)
from vllm.entrypoints.generate.decisions.decide.settings import (
    DEFAULT_MAX_ADAPTERS,
    PREFIX,
    Settings,
)
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.entrypoints.generate.decisions.decide.answers import Decision
    from vllm.entrypoints.generate.decisions.decide.serving.readiness import Readiness
    from vllm.entrypoints.generate.decisions.decide.serving.request import (
        DecisionRequest,
    )
    from vllm.entrypoints.generate.decisions.decide.serving.service import (
        DecisionService,
    )
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels
    from vllm.lora.request import LoRARequest

logger = init_logger(__name__)

# The files of a PEFT adapter whose bytes decide its answers.
WEIGHT_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


@dataclass
class AdapterService:
    adapter: LoRARequest
    service: DecisionService
    started: asyncio.Task[None]


# Builds an adapter's decision service, and starts it (startup.py).
Build = Callable[["LoRARequest"], Awaitable["DecisionService"]]
Start = Callable[["DecisionService"], Coroutine[Any, Any, None]]


class ServedModels:
    """Hands each request to the service of the model it names: ``base``, or one per adapter folder
    (at most ``limit``; without vLLM's ``serving_models``, always the base)."""

    def __init__(
        self,
        base: DecisionService,
        serving_models: OpenAIServingModels | None = None,
        build: Build | None = None,
        start: Start | None = None,
        limit: int = DEFAULT_MAX_ADAPTERS,
    ) -> None:
        from vllm.entrypoints.serve.engine.serving import BaseServing

        self.base = base
        self.serving_models = serving_models
        # vLLM's own model checks, without a request logger (a decision body is logged by its reads).
        self._vllm = (
            BaseServing(serving_models, serving_models.model_config)
            if serving_models is not None
            else None
        )
        self._build, self._start = build, start
        self.limit = limit
        # By adapter_identity, least recently used first.
        self._services: OrderedDict[str, AdapterService] = OrderedDict()
        self._building = asyncio.Lock()
        # Whether a request waits for its adapter's startup work rather than being refused 503 meanwhile
        # (bulk: a batch line or a Python API call has no client to retry it).
        self.wait_for_start = False

    @property
    def settings(self) -> Settings:
        return self.base.settings

    @property
    def readiness(self) -> Readiness:
        """The base model's: an adapter's service starts only on a ready base."""
        return self.base.readiness

    async def decide(self, request: DecisionRequest) -> Decision:
        adapter = await self.adapter(request.model)
        service = self.base if adapter is None else await self.service_for(adapter)
        return await service.decide(request)

    async def adapter(self, model: str | None) -> LoRARequest | None:
        """The adapter ``model`` names (None: the base), or vLLM's refusal (404)."""
        if self._vllm is None:
            return None
        self.prune()
        # What vLLM's model checks read of a request: its ``model``.
        named = SimpleNamespace(model=model or None)
        if (refusal := await self._vllm._check_model(named)) is not None:
            error = refusal.error
            message = error.message
            if model:  # vLLM's message quotes it whole ("The model `X` does not exist."): cut short
                message = message.replace(model, shown(model, bare=True))
            raise DecisionError(message, HTTPStatus(error.code), param=error.param)
        return self._vllm._maybe_get_adapters(named)

    def _loaded(self) -> dict[str, LoRARequest]:
        return {} if self.serving_models is None else self.serving_models.lora_requests

    def _current(self, held: AdapterService | None) -> bool:
        """Whether vLLM still serves ``held``'s adapter as it was when its service was built."""
        return (
            held is not None
            and self._loaded().get(held.adapter.lora_name) is held.adapter
        )

    async def service_for(self, adapter: LoRARequest) -> DecisionService:
        """``adapter``'s folder's service, built and its startup begun the first time it is asked for."""
        identity = adapter_identity(adapter)
        held = self._services.get(identity)
        if not self._current(held):
            async with self._building:
                held = self._services.get(identity)
                if not self._current(held):
                    self._make_room()
                    assert self._build is not None and self._start is not None
                    service = await self._build(adapter)
                    started = asyncio.create_task(self._start(service))
                    held = AdapterService(adapter, service, started)
                    self._services[identity] = held
        assert held is not None
        self._services.move_to_end(identity)
        if self.wait_for_start:
            await asyncio.shield(held.started)
        return held.service

    def _make_room(self) -> None:
        """Set aside the least recently used started services; when all are starting, 503."""
        while len(self._services) >= self.limit:
            idle = next(
                (key for key, held in self._services.items() if held.started.done()),
                None,
            )
            if idle is None:
                raise NotReadyError(
                    f"{len(self._services)} LoRA adapters' decision services are starting, the most at once "
                    f"({PREFIX}MAX_ADAPTERS={self.limit}); retry shortly"
                )
            held = self._services.pop(idle)
            logger.info(
                "decisions through LoRA adapter %r set aside: %d adapters in use (%sMAX_ADAPTERS); "
                "its calibration stays saved",
                held.adapter.lora_name,
                self.limit,
                PREFIX,
            )

    async def start_loaded(self) -> None:
        """Start every adapter vLLM serves now (``--lora-modules``), one after another."""
        for adapter in list(self._loaded().values()):
            await self.service_for(adapter)
            if (held := self._services.get(adapter_identity(adapter))) is not None:
                await held.started

    def prune(self) -> None:
        """Drop the services of adapters vLLM no longer serves as they were."""
        served = self._loaded()
        for identity, held in list(self._services.items()):
            if not self._current(held):
                name = held.adapter.lora_name
                logger.info(
                    "decisions through LoRA adapter %r dropped: it is %s",
                    name,
                    "loaded again" if name in served else "unloaded",
                )
                held.started.cancel()
                del self._services[identity]

    def services(self) -> dict[str, DecisionService]:
        return {
            held.adapter.lora_name: held.service for held in self._services.values()
        }


def adapter_identity(adapter: LoRARequest) -> str:
    """Which adapter a LoRARequest loads: its resolved folder (``x``, ``./x`` and ``x/`` are one), or
    its path as given where that is no local folder (a hub id)."""
    path = adapter.lora_path
    return (
        "path:" + os.path.realpath(path)
        if path and os.path.exists(path)
        else f"name:{path or adapter.lora_name}"
    )


def weights_sha256(path: str) -> str:
    """SHA-256 over an adapter's weight files and config; one not in a local folder is keyed by path."""
    folder = Path(path)
    digest = hashlib.sha256()
    files = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not files:
        digest.update(f"path:{path}".encode())
    for file in files:
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
