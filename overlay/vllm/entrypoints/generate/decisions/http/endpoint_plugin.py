# SPDX-License-Identifier: Apache-2.0
"""The decision endpoints as a vLLM endpoint plugin, whose ``init_state`` vLLM calls in each API server
and in run-batch. Not discovered by entry point: vLLM loads those only for names in ``VLLM_PLUGINS``,
which would stop every unlisted plugin; ``VLLM_ENABLE_TYPED_DECISIONS`` stays the one switch."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Iterable

from fastapi import FastAPI
from starlette.datastructures import State

from vllm.engine.protocol import EngineClient
from vllm.entrypoints.generate.decisions.http.api_router import (
    register_decisions_api_router,
)
from vllm.entrypoints.generate.decisions.runtime.startup import init_decisions_state
from vllm.logger import init_logger
from vllm.tasks import SupportedTask

logger = init_logger(__name__)


class DecisionsEndpoint:
    """``/v1/decisions`` and ``/v1/systemone`` on vLLM's app, and the decision service on its state."""

    name = "typed_decisions"
    # The logit backend reads a generative model; the encoder backend a Laya decision model.
    required_tasks: tuple[SupportedTask, ...] = ("generate", "token_classify")

    def serves(self, supported_tasks: Iterable[str]) -> bool:
        return bool(set(self.required_tasks) & set(supported_tasks))

    def attach_router(self, app: FastAPI) -> None:
        register_decisions_api_router(app)

    async def init_state(
        self, engine_client: EngineClient | None, state: State, args: Namespace
    ) -> None:
        # vLLM's render server has no engine (it never lists this plugin, but must not fail it)
        if engine_client is None:
            logger.warning(
                "typed decisions need an engine; none on this server, so none are served"
            )
            return
        await init_decisions_state(engine_client, state, args)


def decision_plugins(supported_tasks: Iterable[str]) -> list[DecisionsEndpoint]:
    """For a state's ``endpoint_plugins``: the plugin when the server's tasks let it serve."""
    plugin = DecisionsEndpoint()
    return [plugin] if plugin.serves(supported_tasks) else []


def attach_decisions(app: FastAPI, supported_tasks: Iterable[str]) -> None:
    """The routes on ``app``, and the plugin beside vLLM's so that ``init_app_state`` starts it."""
    plugins = decision_plugins(supported_tasks)
    for plugin in plugins:
        plugin.attach_router(app)
    app.state.endpoint_plugins = [*getattr(app.state, "endpoint_plugins", []), *plugins]
