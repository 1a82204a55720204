"""Which model a decision request names (adapters.py): vLLM's own checks over its OpenAIServingModels, each
wire's shape for an unknown model, a LoRA adapter's own decision service with the adapter on every read,
and adapters dropped when vLLM no longer serves them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from vllm.entrypoints.generate.decisions.bulk import Decisions
from vllm.entrypoints.generate.decisions.decide import paths
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.runtime.adapters import (
    ServedModels,
    weights_sha256,
)
from vllm.entrypoints.openai.models.protocol import BaseModelPath
from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.lora.request import LoRARequest

from .fakes import ScriptedBackend
from .test_wire import JEV_REQUEST, OPENAI_REQUEST, descending

# vLLM's own model checks differ between versions (0.32 lists the valid names): both are run.
pytestmark = pytest.mark.vllm032

SERVED = "served-model"


class ContextBackend(ScriptedBackend):
    """Scripted scores; keeps the adapter every read's context names."""

    def __init__(self) -> None:
        super().__init__(descending)
        self.adapters: list[LoRARequest | None] = []

    async def read(self, question, context):
        self.adapters.append(context.adapter)
        return await super().read(question, context)


def serving_models() -> OpenAIServingModels:
    """vLLM's own model registry over an engine that is never called."""
    config = SimpleNamespace(model="/models/base", max_model_len=2048)
    engine = SimpleNamespace(model_config=config, renderer=None, input_processor=None)
    # type: ignore[arg-type]
    return OpenAIServingModels(
        engine, [BaseModelPath(name=SERVED, model_path="/models/base")]
    )


@pytest.fixture
def models() -> OpenAIServingModels:
    served = serving_models()
    served.lora_requests["judge"] = LoRARequest("judge", 1, "/adapters/judge")
    return served


@pytest.fixture
async def service(models):
    built: list[DecisionService] = []

    async def build(adapter: LoRARequest) -> DecisionService:
        adapted = DecisionService(
            Settings.from_env({}), ContextBackend(), adapter.lora_name, adapter=adapter
        )
        built.append(adapted)
        return adapted

    async def start(adapted: DecisionService) -> None:
        await adapted.start()

    base = DecisionService(Settings.from_env({}), ContextBackend(), SERVED)
    await base.start()
    served = ServedModels(base, models, build, start)
    served.wait_for_start = True  # as bulk does; the readiness test turns it off
    served.built = built  # type: ignore[attr-defined]
    return served


@pytest.mark.parametrize("name", [None, "", SERVED])
async def test_no_name_or_a_served_name_is_the_base_model(models, name):
    resolved = ServedModels(None, models)  # type: ignore[arg-type]
    assert await resolved.adapter(name) is None


async def test_an_adapter_name_is_its_lora_request(models):
    # type: ignore[arg-type]
    assert (
        await ServedModels(None, models).adapter("judge")
        is models.lora_requests["judge"]
    )


async def test_an_unknown_name_is_vllms_404(models):
    with pytest.raises(DecisionError) as refused:
        await ServedModels(None, models).adapter("any")  # type: ignore[arg-type]
    assert refused.value.status == 404 and refused.value.param == "model"
    assert refused.value.message.startswith("The model `any` does not exist.")


async def test_vllms_switch_takes_any_name_as_the_base(models, monkeypatch):
    monkeypatch.setenv("VLLM_SKIP_MODEL_NAME_VALIDATION", "1")
    assert await ServedModels(None, models).adapter("any") is None  # type: ignore[arg-type]


async def test_unknown_model_in_each_wires_shape(service):
    decisions = Decisions(service)
    openai = await decisions.decide(
        {**OPENAI_REQUEST, "model": "nope"}, paths.DECISIONS
    )
    assert openai.status == 404
    assert (
        openai.body["error"]["type"] == "NotFoundError"
        and openai.body["error"]["param"] == "model"
    )
    assert openai.body["error"]["message"].startswith(
        "The model `nope` does not exist."
    )
    jev = await decisions.decide({**JEV_REQUEST, "model": "nope"}, paths.SYSTEMONE)
    assert jev.status == 404
    assert jev.body["detail"]["error_type"] == "not_found_error"
    assert jev.body["detail"]["message"].startswith("The model `nope` does not exist.")
    missing = {k: v for k, v in JEV_REQUEST.items() if k != "model"}
    assert (await decisions.decide(missing, paths.SYSTEMONE)).status == 200, (
        "Jev's model is optional"
    )
    not_text = await decisions.decide({**JEV_REQUEST, "model": 3}, paths.SYSTEMONE)
    assert not_text.status == 422 and not_text.body["detail"][0]["loc"] == [
        "body",
        "model",
    ]


async def test_an_adapter_is_answered_by_its_own_service_reading_through_it(
    service, models
):
    decisions = Decisions(service)
    base = await decisions.decide({**OPENAI_REQUEST, "model": SERVED})
    assert base.status == 200 and base.body["model"] == SERVED
    assert set(service.base.backend.adapters) == {None}
    assert "adapter" not in base.body["answers"][0]["extra"]["audit"]
    adapted = await decisions.decide({**OPENAI_REQUEST, "model": "judge"})
    assert adapted.status == 200, adapted.body
    assert adapted.body["model"] == "judge"
    assert adapted.body["answers"][0]["extra"]["audit"]["adapter"] == "judge"
    (built,) = service.built
    assert set(built.backend.adapters) == {models.lora_requests["judge"]}
    assert (
        await decisions.decide({**JEV_REQUEST, "model": "judge"}, paths.SYSTEMONE)
    ).body["model"] == "judge"
    assert len(service.built) == 1, "one service per adapter"


async def test_an_adapter_starting_is_refused_for_that_adapter_only(service, models):
    gate = asyncio.Event()

    async def slow_start(adapted: DecisionService) -> None:
        await adapted.start(lambda: gate.wait())  # type: ignore[arg-type,return-value]

    service._start = slow_start
    service.wait_for_start = False  # as a server does
    decisions = Decisions(service)
    waiting = await decisions.decide({**OPENAI_REQUEST, "model": "judge"})
    assert waiting.status == 503
    assert (await decisions.decide({**OPENAI_REQUEST, "model": SERVED})).status == 200


async def test_unloaded_or_reloaded_adapters_are_dropped(service, models):
    decisions = Decisions(service)
    assert (await decisions.decide({**OPENAI_REQUEST, "model": "judge"})).status == 200
    first = service.services()["judge"]
    # loaded again in place
    models.lora_requests["judge"] = LoRARequest("judge", 1, "/adapters/judge-v2")
    assert (await decisions.decide({**OPENAI_REQUEST, "model": "judge"})).status == 200
    assert service.services()["judge"] is not first
    del models.lora_requests["judge"]  # /v1/unload_lora_adapter
    assert (await decisions.decide({**OPENAI_REQUEST, "model": "judge"})).status == 404
    assert service.services() == {}


def test_weights_hash_follows_the_weights(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"one")
    first = weights_sha256(str(tmp_path))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"two")
    assert weights_sha256(str(tmp_path)) != first
    assert weights_sha256("org/hub-adapter") != weights_sha256("org/other-adapter")


async def test_names_of_one_adapter_folder_share_one_service(service, models, tmp_path):
    """x, ./x, x/ and x/. (as vLLM's filesystem resolver builds them) are one adapter: one service."""
    folder = tmp_path / "x"
    folder.mkdir()
    names = {
        "x": str(folder),
        "./x": str(tmp_path / "." / "x"),
        "x/": f"{folder}/",
        "x/.": f"{folder}/.",
    }
    for number, (name, path) in enumerate(names.items(), start=2):
        models.lora_requests[name] = LoRARequest(name, number, path)
    decisions = Decisions(service)
    for name in names:
        answered = await decisions.decide({**OPENAI_REQUEST, "model": name})
        assert answered.status == 200, answered.body
    assert len(service.built) == 1, "one service per adapter folder"
    assert list(service.services()) == ["x"]
    # Unloading the name the service reads through drops it; another name of the folder builds it anew.
    del models.lora_requests["x"]
    assert (await decisions.decide({**OPENAI_REQUEST, "model": "x/"})).status == 200
    assert len(service.built) == 2 and list(service.services()) == ["x/"]


async def test_adapter_services_are_capped_least_recently_used_out(service, models):
    for number in range(3):
        models.lora_requests[f"a{number}"] = LoRARequest(
            f"a{number}", 10 + number, f"/adapters/a{number}"
        )
    service.limit = 2
    decisions = Decisions(service)
    for name in ("a0", "a1", "a0", "a2"):
        assert (await decisions.decide({**OPENAI_REQUEST, "model": name})).status == 200
    assert sorted(service.services()) == ["a0", "a2"], (
        "a1, least recently used, was set aside"
    )
    assert (await decisions.decide({**OPENAI_REQUEST, "model": "a1"})).status == 200
    assert len(service.built) == 4 and sorted(service.services()) == ["a1", "a2"]


async def test_past_the_cap_with_every_adapter_starting_a_new_one_waits(
    service, models
):
    gate = asyncio.Event()

    async def slow_start(adapted: DecisionService) -> None:
        await adapted.start(lambda: gate.wait())  # type: ignore[arg-type,return-value]

    models.lora_requests["other"] = LoRARequest("other", 2, "/adapters/other")
    service._start, service.wait_for_start, service.limit = (
        slow_start,
        False,
        1,
    )
    decisions = Decisions(service)
    assert (await decisions.decide({**OPENAI_REQUEST, "model": "judge"})).status == 503
    refused = await decisions.decide({**OPENAI_REQUEST, "model": "other"})
    assert (
        refused.status == 503
        and "VLLM_TYPED_DECISIONS_MAX_ADAPTERS=1" in refused.body["error"]["message"]
    )
    assert len(service.built) == 1, "no second service starts past the cap"
    gate.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert (
        await decisions.decide({**OPENAI_REQUEST, "model": "other"})
    ).status == 503  # now starting
    assert len(service.built) == 2 and list(service.services()) == ["other"]
