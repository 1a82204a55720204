"""Backend registry and startup selection (pure logic)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from vllm.entrypoints.generate.decisions.decide.backends import (
    DecisionBackend,
    LogitBackend,
)
from vllm.entrypoints.generate.decisions.decide.backends.registry import (
    backend_options,
    choose_backend,
    register_backend,
    unregister_backend,
)
from vllm.entrypoints.generate.decisions.decide.settings import (
    SettingsError,
    parse_backend_spec,
)


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    samples: int = 1


@pytest.fixture
def claiming():
    class Claiming(DecisionBackend):
        name = "claiming"
        architectures = ("LlamaForCausalLM",)
        options_model = Options

        async def read(self, question, context):
            raise NotImplementedError

    register_backend(Claiming)
    yield Claiming
    unregister_backend("claiming")


def test_a_plugin_claim_wins_over_the_default(claiming):
    assert choose_backend(parse_backend_spec(""), ("LlamaForCausalLM",)) is claiming
    assert choose_backend(parse_backend_spec(""), ("GPT2LMHeadModel",)) is LogitBackend


def test_the_variable_wins_over_a_claim(claiming):
    assert (
        choose_backend(parse_backend_spec("logit"), ("LlamaForCausalLM",))
        is LogitBackend
    )


def test_unknown_backend_names_the_registered_ones(claiming):
    with pytest.raises(
        SettingsError, match="registered: canvas, claiming, encoder, logit"
    ):
        choose_backend(parse_backend_spec("diffusion"), ())


def test_arguments_are_validated_by_the_options_model(claiming):
    assert (
        backend_options(claiming, parse_backend_spec("claiming:samples=5").args).samples
        == 5
    )
    with pytest.raises(SettingsError, match="seed"):
        backend_options(claiming, parse_backend_spec("claiming:seed=5").args)
