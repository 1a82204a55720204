# SPDX-License-Identifier: Apache-2.0
"""Server startup: settings -> backend -> decision service -> startup work in the background.

Bad settings stop the server here, with a message naming the variable. Startup work (the backend's
own checks) runs as a task, so vLLM's ``/health`` comes up while decision requests get 503.
"""

from __future__ import annotations

import asyncio
import contextlib
from argparse import Namespace
from pathlib import Path
from typing import Any

from starlette.datastructures import State

from vllm.engine.protocol import EngineClient
from vllm.logger import init_logger

from . import questions
from .backends import DecisionBackend, backend_names, backend_options, choose_backend
from .deployment_lock import exclusive, identify_run, run_id
from .host import VllmHost
from .plugins import load_plugins
from .service import DecisionService
from .settings import Settings

logger = init_logger(__name__)


def served_model_name(args: Namespace) -> str:
    names = getattr(args, "served_model_name", None)
    return names[0] if names else args.model


async def init_decisions_state(engine_client: EngineClient, state: State, args: Namespace) -> None:
    from vllm.entrypoints.chat_utils import load_chat_template
    from vllm.entrypoints.launchers.cli_args import resolve_default_chat_template_kwargs

    settings = Settings.from_env()
    identify_run(getattr(args, "api_server_count", None))
    questions.max_rendered_chars = settings.max_input_chars
    load_plugins()
    host = VllmHost(
        engine_client,
        served_model_name(args),
        chat_template=load_chat_template(args.chat_template),
        chat_template_kwargs=resolve_default_chat_template_kwargs(args),
    )
    backend_cls = choose_backend(settings.backend, host.architectures)
    backend = backend_cls(host, backend_options(backend_cls, settings.backend.args), settings)
    service = DecisionService(settings, backend, host.served_model)
    state.decision_service = service
    state.decision_auth = api_key_checker(args)
    state.decision_startup = asyncio.create_task(_start(service, deployment(engine_client, host.served_model)))
    logger.info("typed decisions enabled: backend %s (%s) for %s; loaded backends: %s", backend.name,
                "configured" if settings.backend.name else "chosen for the model", host.architectures,
                ", ".join(backend_names()))  # fmt: skip


def api_key_checker(args: Namespace) -> Any:
    """vLLM's own token check, for our routes outside the paths its middleware guards; None without keys."""
    import vllm.envs as envs
    from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

    tokens = [key for key in (getattr(args, "api_key", None) or [envs.VLLM_API_KEY]) if key]
    return AuthenticationMiddleware(app=None, tokens=tokens) if tokens else None


def deployment(engine_client: EngineClient, served_model: str) -> dict[str, Any]:
    """What identifies the served model for saved calibrations."""
    config = engine_client.model_config
    return {
        "model": served_model,
        "model_path": config.model,
        "revision": config.revision,
        "quantization": config.quantization,
        "dtype": str(config.dtype),
    }


async def start_backend_once(backend: DecisionBackend, settings: Settings, model: dict[str, Any]) -> None:
    """The backend's startup check, run by one API-server process of this server and adopted by the
    others (deployment_lock.py); backends without a shareable check start in every process."""
    from .calibration import store

    key = {**model, "backend": backend.name, "backend_args": dict(settings.backend.args),
           "min_option_mass": settings.min_option_mass}  # fmt: skip
    directory = Path(settings.calibration_dir)
    async with exclusive(store.lock_path(directory, key, "startup"), settings.startup_wait,
                         "startup check"):  # fmt: skip
        saved = store.load(directory, key, "startup")
        if saved is not None and saved.get("run") == run_id():
            logger.info("decision startup check: adopting the result of another API-server process")
            backend.adopt(saved["facts"])
            return
        facts = await backend.startup_check()
        if facts is None:
            await backend.start()
            return
        with contextlib.suppress(OSError):
            store.save(directory, key, {"facts": facts, "run": run_id()}, "startup")
        backend.adopt(facts)


async def _start(service: DecisionService, model: dict[str, Any]) -> None:
    from .calibration.startup import startup_calibration
    from .calibration.temperature import Temperatures

    async def calibrate() -> Temperatures:
        return await startup_calibration(service.backend, service.settings, model)

    async def start_backend() -> None:
        await start_backend_once(service.backend, service.settings, model)

    try:
        await service.start(calibrate, start_backend)
    except Exception:
        logger.exception("decision startup failed; decision requests will get 503")
