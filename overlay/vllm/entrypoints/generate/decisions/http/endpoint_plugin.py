# SPDX-License-Identifier: Apache-2.0
"""The decision endpoints as a vLLM endpoint plugin (``vllm/plugins/endpoint_plugins/interface.py``).

vLLM's own code then starts the decision service: ``init_app_state`` calls ``init_state`` on every
plugin listed in ``state.endpoint_plugins``, in each API-server process and in ``vllm run-batch``, at
the point where the router patch used to call ``init_decisions_state`` itself.

The plugin is not discovered through the ``vllm.endpoint_plugins`` entry-point group: vLLM loads that
group only for names listed in ``VLLM_PLUGINS``, and listing a name there also stops every plugin of
the other groups that is not listed. ``VLLM_ENABLE_TYPED_DECISIONS`` stays the one switch, so the
router patch puts this plugin on the app itself (:func:`attach_decisions`, called by vLLM's
``build_app`` right after it attaches its discovered plugins) and on run-batch's state
(:func:`decision_plugins`).
"""

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
        """vLLM's gating rule for endpoint plugins: one required task among the server's."""
        return bool(set(self.required_tasks) & set(supported_tasks))

    def attach_router(self, app: FastAPI) -> None:
        register_decisions_api_router(app)

    async def init_state(
        self, engine_client: EngineClient | None, state: State, args: Namespace
    ) -> None:
        # vLLM's render server has no engine; its one task ("render") is not among ours, so it never
        # lists this plugin, but a plugin must not fail there.
        if engine_client is None:
            logger.warning(
                "typed decisions need an engine; none on this server, so none are served"
            )
            return
        await init_decisions_state(engine_client, state, args)


def decision_plugins(supported_tasks: Iterable[str]) -> list[DecisionsEndpoint]:
    """The plugin when the server's tasks let it serve, else nothing (for a state's endpoint_plugins)."""
    plugin = DecisionsEndpoint()
    return [plugin] if plugin.serves(supported_tasks) else []


def attach_decisions(app: FastAPI, supported_tasks: Iterable[str]) -> None:
    """The routes on ``app`` and the plugin beside the ones vLLM attached (``app.state.endpoint_plugins``),
    so that vLLM's ``init_app_state`` starts the decision service. Called with decisions switched on."""
    plugins = decision_plugins(supported_tasks)
    for plugin in plugins:
        plugin.attach_router(app)
    app.state.endpoint_plugins = [*getattr(app.state, "endpoint_plugins", []), *plugins]
