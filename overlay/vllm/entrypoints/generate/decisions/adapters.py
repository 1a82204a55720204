# SPDX-License-Identifier: Apache-2.0
"""Which model a decision request names, and one decision service per LoRA adapter.

A request's ``model`` is resolved exactly as vLLM's own endpoints resolve it, by vLLM's own code
(``BaseServing._check_model`` and ``_maybe_get_adapters`` over the server's ``OpenAIServingModels``): no
name or a served model name is the base model; an adapter's name (``--lora-modules``, or loaded at run
time) is that adapter's ``LoRARequest``; anything else is vLLM's 404 "The model `X` does not exist."
vLLM's own ``VLLM_SKIP_MODEL_NAME_VALIDATION=1`` takes any other name as the base model.

An adapter changes the model's answers, so each adapter is answered by a decision service of its own
(startup.py builds it over the same engine, reading through the adapter): its own self-check,
calibration and readiness, saved under the adapter's name and weights. It starts at startup for
``--lora-modules`` adapters and on the first request naming it otherwise (503 with Retry-After for that
adapter meanwhile), and is dropped when vLLM no longer serves the adapter (unloaded, or loaded again).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger

from .errors import DecisionError

if TYPE_CHECKING:
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels
    from vllm.lora.request import LoRARequest

    from .service import DecisionService

logger = init_logger(__name__)

# The files of a PEFT adapter whose bytes decide its answers.
WEIGHT_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


@dataclass(frozen=True)
class Named:
    """What vLLM's model checks read of a request: its ``model``."""

    model: str | None


@dataclass
class AdapterService:
    """The decision service answering through one adapter, and its startup work."""

    adapter: LoRARequest
    service: DecisionService
    started: asyncio.Task[None]


# Builds an adapter's decision service, and starts it (startup.py).
Build = Callable[["LoRARequest"], Awaitable["DecisionService"]]
Start = Callable[["DecisionService"], Coroutine[Any, Any, None]]


class ServedModels:
    """The server's models as vLLM serves them, and a decision service per adapter in use."""

    def __init__(self, serving_models: OpenAIServingModels, build: Build, start: Start) -> None:
        from vllm.entrypoints.serve.engine.serving import BaseServing

        self.serving_models = serving_models
        # vLLM's own model checks, without a request logger (a decision body is logged by its reads).
        self._vllm = BaseServing(serving_models, serving_models.model_config)
        self._build, self._start = build, start
        self._services: dict[str, AdapterService] = {}
        self._building = asyncio.Lock()
        # Whether a request waits for its adapter's startup work rather than being refused 503 meanwhile
        # (bulk: a batch line or a Python API call has no client to retry it).
        self.wait_for_start = False

    async def adapter(self, model: str | None) -> LoRARequest | None:
        """The adapter ``model`` names (None: the base model), or vLLM's refusal of an unknown model. Under
        ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` vLLM's LoRA resolvers may load it here, as for its own APIs."""
        self.prune()
        named: Any = Named(model or None)
        refusal = await self._vllm._check_model(named)
        if refusal is not None:
            error = refusal.error
            raise DecisionError(error.message, HTTPStatus(error.code), param=error.param)
        return self._vllm._maybe_get_adapters(named)

    async def service_for(self, adapter: LoRARequest) -> DecisionService:
        """The decision service of ``adapter``, built and its startup begun the first time it is asked for."""
        held = self._services.get(adapter.lora_name)
        if held is not None and held.adapter is adapter:
            return held.service
        async with self._building:
            held = self._services.get(adapter.lora_name)
            if held is None or held.adapter is not adapter:
                service = await self._build(adapter)
                held = AdapterService(adapter, service, asyncio.create_task(self._start(service)))
                self._services[adapter.lora_name] = held
        if self.wait_for_start:
            await asyncio.shield(held.started)
        return held.service

    async def start_loaded(self) -> None:
        """Start every adapter vLLM serves now (``--lora-modules``), one after another."""
        for adapter in list(self.serving_models.lora_requests.values()):
            await self.service_for(adapter)
            await self._services[adapter.lora_name].started

    def prune(self) -> None:
        """Drop the services of adapters vLLM no longer serves as they were (unloaded, or loaded again)."""
        served = self.serving_models.lora_requests
        for name, held in list(self._services.items()):
            if served.get(name) is not held.adapter:
                logger.info("decisions through LoRA adapter %r dropped: it is %s", name,
                            "loaded again" if name in served else "unloaded")  # fmt: skip
                held.started.cancel()
                del self._services[name]

    def services(self) -> dict[str, DecisionService]:
        return {name: held.service for name, held in self._services.items()}


def weights_sha256(path: str) -> str:
    """SHA-256 over an adapter's weight files (and config), so a saved calibration is reused only for the
    same weights; an adapter that isn't a local folder (a hub id vLLM downloads) is keyed by its path."""
    folder = Path(path)
    digest = hashlib.sha256()
    files = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()] if folder.is_dir() else []
    if not files:
        digest.update(f"path:{path}".encode())
    for file in files:
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
