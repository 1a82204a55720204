"""Which model a decision request names (adapters.py): vLLM's own checks over its OpenAIServingModels, each
wire's shape for an unknown model, a LoRA adapter's own decision service with the adapter on every read,
and adapters dropped when vLLM no longer serves them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from vllm.entrypoints.generate.decisions import paths
from vllm.entrypoints.generate.decisions.adapters import ServedModels, weights_sha256
from vllm.entrypoints.generate.decisions.bulk import Decisions
from vllm.entrypoints.generate.decisions.errors import DecisionError
from vllm.entrypoints.generate.decisions.service import DecisionService
from vllm.entrypoints.generate.decisions.settings import Settings
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
    return OpenAIServingModels(engine, [BaseModelPath(name=SERVED, model_path="/models/base")])  # type: ignore[arg-type]


@pytest.fixture
def models() -> OpenAIServingModels:
    served = serving_models()
    served.lora_requests["judge"] = LoRARequest("judge", 1, "/adapters/judge")
    return served


@pytest.fixture
async def service(models):
    built: list[DecisionService] = []

    async def build(adapter: LoRARequest) -> DecisionService:
        adapted = DecisionService(Settings.from_env({}), ContextBackend(), adapter.lora_name, adapter=adapter)
        built.append(adapted)
        return adapted

    async def start(adapted: DecisionService) -> None:
        await adapted.start()

    base = DecisionService(Settings.from_env({}), ContextBackend(), SERVED)
    await base.start()
    base.models = ServedModels(models, build, start)
    base.models.wait_for_start = True  # as bulk does; the readiness test turns it off
    base.built = built  # type: ignore[attr-defined]
    return base


@pytest.mark.parametrize("name", [None, "", SERVED])
async def test_no_name_or_a_served_name_is_the_base_model(models, name):
    resolved = ServedModels(models, None, None)  # type: ignore[arg-type]
    assert await resolved.adapter(name) is None


async def test_an_adapter_name_is_its_lora_request(models):
    assert await ServedModels(models, None, None).adapter("judge") is models.lora_requests["judge"]  # type: ignore[arg-type]


async def test_an_unknown_name_is_vllms_404(models):
    with pytest.raises(DecisionError) as refused:
        await ServedModels(models, None, None).adapter("any")  # type: ignore[arg-type]
    assert refused.value.status == 404 and refused.value.param == "model"
    assert refused.value.message.startswith("The model `any` does not exist.")


async def test_vllms_switch_takes_any_name_as_the_base(models, monkeypatch):
    monkeypatch.setenv("VLLM_SKIP_MODEL_NAME_VALIDATION", "1")
    assert await ServedModels(models, None, None).adapter("any") is None  # type: ignore[arg-type]


async def test_unknown_model_in_each_wires_shape(service):
    decisions = Decisions(service)
    openai = await decisions.decide({**OPENAI_REQUEST, "model": "nope"}, paths.DECISIONS)
    assert openai.status == 404
    assert openai.body["error"]["type"] == "NotFoundError" and openai.body["error"]["param"] == "model"
    assert openai.body["error"]["message"].startswith("The model `nope` does not exist.")
    jev = await decisions.decide({**JEV_REQUEST, "model": "nope"}, paths.SYSTEMONE)
    assert jev.status == 404
    assert jev.body["detail"]["error_type"] == "not_found_error"
    assert jev.body["detail"]["message"].startswith("The model `nope` does not exist.")
    missing = {k: v for k, v in JEV_REQUEST.items() if k != "model"}
    assert (await decisions.decide(missing, paths.SYSTEMONE)).status == 200, "Jev's model is optional"
    not_text = await decisions.decide({**JEV_REQUEST, "model": 3}, paths.SYSTEMONE)
    assert not_text.status == 422 and not_text.body["detail"][0]["loc"] == ["body", "model"]


async def test_an_adapter_is_answered_by_its_own_service_reading_through_it(service, models):
    decisions = Decisions(service)
    base = await decisions.decide({**OPENAI_REQUEST, "model": SERVED})
    assert base.status == 200 and base.body["model"] == SERVED
    assert set(service.backend.adapters) == {None}
    assert "adapter" not in base.body["answers"][0]["extra"]["audit"]
    adapted = await decisions.decide({**OPENAI_REQUEST, "model": "judge"})
    assert adapted.status == 200, adapted.body
    assert adapted.body["model"] == "judge"
    assert adapted.body["answers"][0]["extra"]["audit"]["adapter"] == "judge"
    (built,) = service.built
    assert set(built.backend.adapters) == {models.lora_requests["judge"]}
    assert (await decisions.decide({**JEV_REQUEST, "model": "judge"}, paths.SYSTEMONE)).body["model"] == "judge"
    assert len(service.built) == 1, "one service per adapter"


async def test_an_adapter_starting_is_refused_for_that_adapter_only(service, models):
    gate = asyncio.Event()

    async def slow_start(adapted: DecisionService) -> None:
        await adapted.start(lambda: gate.wait())  # type: ignore[arg-type,return-value]

    service.models._start = slow_start
    service.models.wait_for_start = False  # as a server does
    decisions = Decisions(service)
    waiting = await decisions.decide({**OPENAI_REQUEST, "model": "judge"})
    assert waiting.status == 503
    assert (await decisions.decide({**OPENAI_REQUEST, "model": SERVED})).status == 200


async def test_unloaded_or_reloaded_adapters_are_dropped(service, models):
    decisions = Decisions(service)
    assert (await decisions.decide({**OPENAI_REQUEST, "model": "judge"})).status == 200
    first = service.models.services()["judge"]
    models.lora_requests["judge"] = LoRARequest("judge", 1, "/adapters/judge-v2")  # loaded again in place
    assert (await decisions.decide({**OPENAI_REQUEST, "model": "judge"})).status == 200
    assert service.models.services()["judge"] is not first
    del models.lora_requests["judge"]  # /v1/unload_lora_adapter
    assert (await decisions.decide({**OPENAI_REQUEST, "model": "judge"})).status == 404
    assert service.models.services() == {}


def test_weights_hash_follows_the_weights(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"one")
    first = weights_sha256(str(tmp_path))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"two")
    assert weights_sha256(str(tmp_path)) != first
    assert weights_sha256("org/hub-adapter") != weights_sha256("org/other-adapter")
