# SPDX-License-Identifier: Apache-2.0
"""Server startup: settings -> backend -> decision service -> startup work in the background (a task,
so vLLM's ``/health`` comes up while decision requests get 503)."""

from __future__ import annotations

import asyncio
from argparse import Namespace
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from starlette.datastructures import State

from vllm.engine.protocol import EngineClient
from vllm.entrypoints.generate.decisions.calibration.deployment_lock import (
    identify_run,
    once_per_server,
    run_id,
    this_run,
)
from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.backends.registry import (
    backend_names,
    backend_options,
    choose_backend,
)
from vllm.entrypoints.generate.decisions.decide.engine.vllm_host import VllmHost
from vllm.entrypoints.generate.decisions.decide.errors import BackendUnavailable
from vllm.entrypoints.generate.decisions.decide.metrics import init_metrics
from vllm.entrypoints.generate.decisions.decide.serving.readiness import (
    CALIBRATION,
    Readiness,
)
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.decide.temperature import FIRST_PASS
from vllm.entrypoints.generate.decisions.runtime.adapters import (
    ServedModels,
    weights_sha256,
)
from vllm.entrypoints.generate.decisions.runtime.model_identity import (
    content_key,
    deployment,
)
from vllm.entrypoints.generate.decisions.runtime.plugins import load_plugins
from vllm.logger import init_logger

logger = init_logger(__name__)


def served_model_name(args: Namespace) -> str:
    names = getattr(args, "served_model_name", None)
    return names[0] if names else str(args.model)


async def init_decisions_state(
    engine_client: EngineClient, state: State, args: Namespace
) -> None:
    """The server's models and their decision services on the app state; startup work as a task."""
    served = state.decision_service = build_service(
        engine_client, args, getattr(state, "openai_serving_models", None)
    )
    # vLLM's own middleware echoes X-Request-Id under --enable-request-id-headers; the routes do otherwise.
    state.decision_echo_request_id = not getattr(
        args, "enable_request_id_headers", False
    )
    # Held so the task lives on; how it is going is the base service's readiness's to say.
    state.decision_startup = asyncio.create_task(start_served(served))


def build_service(
    engine_client: EngineClient, args: Namespace, serving_models: Any = None
) -> ServedModels:
    """The served models for ``vllm serve`` or ``vllm run-batch`` (``args``: either's), not started."""
    from vllm.entrypoints.generate.decisions.decide.vllm_versions import (
        load_chat_template,
    )
    from vllm.entrypoints.launchers.cli_args import resolve_default_chat_template_kwargs
    from vllm.entrypoints.serve.utils.request_logger import RequestLogger

    settings = Settings.from_env()
    identify_run(getattr(args, "api_server_count", None))
    load_plugins()
    host = VllmHost(
        engine_client,
        served_model_name(args),
        chat_template=load_chat_template(getattr(args, "chat_template", None)),
        chat_template_kwargs=resolve_default_chat_template_kwargs(args)
        if hasattr(args, "default_chat_template_kwargs")
        else None,
        request_logger=RequestLogger(max_log_len=args.max_log_len)
        if getattr(args, "enable_log_requests", False)
        else None,
    )
    # metrics.py: after vLLM's stat logger, in every API-server process
    init_metrics(host.served_model)
    config = engine_client.model_config
    model = deployment(
        config,
        host.served_model,
        host.chat_template,
        host.chat_template_kwargs,
        host.logit_dtype,
    )
    content = Once(
        lambda: content_key(
            config.model,
            config.revision,
            getattr(config, "tokenizer", None),
            getattr(config, "tokenizer_revision", None),
            settings.calibration_dir,
        )
    )
    service = new_service(settings, host, model, content=content)
    logger.info(
        "typed decisions enabled: backend %s (%s) for %s; loaded backends: %s",
        service.backend.name,
        "configured" if settings.backend.name else "chosen for the model",
        host.architectures,
        ", ".join(backend_names()),
    )

    async def adapter_service(adapter: Any) -> DecisionService:
        # Saved startup work is keyed by the adapter's weights besides the base's deployment (not its
        # name: every name of one adapter folder finds its calibration).
        weights = await asyncio.to_thread(weights_sha256, adapter.lora_path)
        key = {**model, **await content(), "adapter_sha256": weights}
        return new_service(settings, host.for_adapter(adapter), key, adapter)

    return ServedModels(
        service, serving_models, adapter_service, start_service, settings.max_adapters
    )


def new_service(
    settings: Settings,
    host: VllmHost,
    model: dict[str, Any],
    adapter: Any = None,
    content: Callable[[], Awaitable[dict[str, Any]]] | None = None,
) -> DecisionService:
    """A service for the configured backend; ``content`` completes ``model`` when startup begins."""
    backend_cls = choose_backend(settings.backend, host.architectures)
    backend = backend_cls(
        host, backend_options(backend_cls, settings.backend.args), settings
    )
    readiness = Readiness()

    async def starter(chosen: DecisionBackend) -> None:
        # The model files' hashes into ``model`` (shared with calibration), then the start.
        if content is not None:
            model.update(await content())
        await start_backend_once(chosen, settings, model, readiness.waiting)

    service = DecisionService(
        settings,
        backend,
        adapter.lora_name if adapter is not None else host.served_model,
        starter=starter,
        readiness=readiness,
        adapter=adapter,
    )
    service.deployment = model
    return service


class Once:
    """A blocking function run once, off the event loop, its result shared by every caller."""

    def __init__(self, work: Callable[[], dict[str, Any]]) -> None:
        self._work = work
        self._task: asyncio.Future[dict[str, Any]] | None = None

    async def __call__(self) -> dict[str, Any]:
        if self._task is None:
            self._task = asyncio.ensure_future(asyncio.to_thread(self._work))
        return dict(await asyncio.shield(self._task))


async def start_backend_once(
    backend: DecisionBackend,
    settings: Settings,
    model: dict[str, Any],
    waiting: Callable[[], None] | None = None,
) -> None:
    """Start ``backend`` once per server: one API-server process runs its start hook and the others adopt
    its facts (or start themselves, for a backend that shares none); a refusal is shared too."""
    key = {
        **model,
        "backend": backend.name,
        "backend_args": dict(settings.backend.args),
        "min_option_mass": settings.min_option_mass,
    }

    async def started() -> dict[str, Any]:
        try:
            facts = await backend.start()
        except BackendUnavailable as exc:
            return {"failure": str(exc), "run": run_id()}
        if facts is not None and (
            backend.facts_model is None or not isinstance(facts, backend.facts_model)
        ):
            raise TypeError(
                f"backend {backend.name!r}: start() returned {type(facts).__name__}, not its facts_model"
            )
        dumped = None if facts is None else facts.model_dump(mode="json")
        return {"facts": dumped, "run": run_id()}

    record, loaded = await once_per_server(
        Path(settings.calibration_dir),
        key,
        "startup",
        settings.startup_wait,
        started,
        this_run,
        waiting,
    )
    if "failure" in record:
        raise BackendUnavailable(record["failure"])
    if loaded and record["facts"] is None:
        await backend.start()
    elif loaded and backend.facts_model is not None:
        logger.info(
            "decision startup check: adopting the result of another API-server process"
        )
        backend.adopt(backend.facts_model.model_validate(record["facts"]))


async def start_served(served: ServedModels) -> None:
    """The base model's startup work, then, once it is ready, each ``--lora-modules`` adapter's."""
    await start_service(served.base)
    if served.base.readiness.ready:
        await served.start_loaded()


async def start_service(service: DecisionService) -> None:
    """One service's startup work; a failure is logged, never raised (requests get 503 with why)."""
    from vllm.entrypoints.generate.decisions.calibration.calibrate import (
        startup_calibration,
    )
    from vllm.entrypoints.generate.decisions.calibration.live_labels import watch

    calibrate = partial(
        startup_calibration,
        service.backend,
        service.settings,
        service.deployment,
        service.readiness,
        service.use_first_pass,
    )
    try:
        await service.start(calibrate)
        watch(service)
    except asyncio.CancelledError:
        # The server's shutdown (its event loop's end), or, for an adapter's, the adapter unloaded.
        logger.info("%s", cut_short(service, "cancelled"))
        raise
    except BackendUnavailable as exc:  # its message says why and what to change
        logger.error(
            "decisions unavailable on this server (decision requests will get 503): %s",
            exc,
        )
    except Exception as exc:
        host = service.backend.host
        if host is not None and host.stopped_by(exc):
            logger.info("%s", cut_short(service, "stopped with the engine"))
        elif service.calibrated.stage == FIRST_PASS:
            logger.exception(
                "decision calibration: the full calibration failed; the first pass stays in force"
            )
        else:
            logger.exception("decision startup failed; decision requests will get 503")


def cut_short(service: DecisionService, how: str) -> str:
    """The line startup work stopped ``how`` logs: the step and how far it got."""
    readiness, progress = service.readiness, service.readiness.progress
    if service.calibrated.stage == FIRST_PASS:
        return (
            f"decision {CALIBRATION}{service.through} {how} during the full calibration; its first "
            "pass is saved, so the next start answers on it at once and finishes the full "
            "calibration in the background"
        )
    line = f"decision {readiness.step or 'startup'}{service.through} {how}"
    if readiness.ready or readiness.step is None:
        return line
    if readiness.waiting_for_other:
        return f"{line} while another API-server process did it"
    if progress is not None:
        return f"{line} after {progress.done} of {progress.total} {progress.unit}"
    return line
