from __future__ import annotations

import logging

import pytest

from ..conftest import model_path


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path("smollm2-135m-instruct"))


@pytest.fixture(
    scope="session",
    params=["smollm2-135m-instruct", "tiny-qwen2-random", "tiny-llama-localtok"],
)
def any_tokenizer(request):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path(request.param))


@pytest.fixture(autouse=True)
def single_reads(request, monkeypatch):
    """Unit tests of the service, the wires and calibration script one score per question in the order
    sent, so they run with VLLM_TYPED_DECISIONS_DEBIAS's default at ``off``; test_debias.py covers the
    rotations and the real default."""
    if request.module.__name__.endswith("test_debias"):
        return
    from vllm.entrypoints.generate.decisions.decide import settings

    monkeypatch.setattr(settings, "DEFAULT_DEBIAS", settings.NO_DEBIAS)


@pytest.fixture(autouse=True)
def package_logs_captured(caplog):
    """The package's INFO lines in ``caplog``: vLLM 0.30 sets its ``vllm`` logger to INFO when imported,
    0.32 only when a server or engine configures logging, so a test sets the level itself."""
    caplog.set_level(logging.INFO, logger="vllm.entrypoints.generate.decisions")
