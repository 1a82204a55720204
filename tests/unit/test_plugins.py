"""Loading entry points: what each group takes, and everything else recorded as a load failure with
its reason. Real ``EntryPoint`` objects naming things in this module, loaded into a fresh server
registry."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from vllm.entrypoints.generate.decisions.decide.backends import (
    DecisionBackend,
    registry,
)
from vllm.entrypoints.generate.decisions.decide.backends.registry import Registry
from vllm.entrypoints.generate.decisions.decide.questions import (
    NoulQuestion,
    Option,
    QuestionType,
)
from vllm.entrypoints.generate.decisions.decide.settings import parse_backend_spec
from vllm.entrypoints.generate.decisions.runtime import plugins

HERE = __name__
BACKENDS, TYPES = plugins.BACKENDS, plugins.QUESTION_TYPES
NOT_A_PLUGIN = "hello"


class Reader(DecisionBackend):
    name = "reader"

    async def read(self, state, question, request_id, options=None):
        raise NotImplementedError


class PlainLogit(Reader):
    name = "logit"


class Mood(QuestionType):
    name = "mood"
    model = NoulQuestion

    def options(self, question):
        return [Option("a", "a", "a"), Option("b", "b", "b")]

    def answer(self, probabilities, options):
        return {}


def replace_logit() -> None:
    registry.register_backend(PlainLogit, override=True)


POINTS = [
    EntryPoint("reader", f"{HERE}:Reader", BACKENDS),
    EntryPoint("wrong-group", f"{HERE}:Mood", BACKENDS),
    EntryPoint("a-module", HERE, BACKENDS),
    EntryPoint("clash", f"{HERE}:PlainLogit", BACKENDS),
    EntryPoint("replacement", f"{HERE}:replace_logit", BACKENDS),
    EntryPoint("mood", f"{HERE}:Mood", TYPES),
    EntryPoint("a-backend", f"{HERE}:Reader", TYPES),
    EntryPoint("a-string", f"{HERE}:NOT_A_PLUGIN", TYPES),
]


@pytest.fixture
def loaded(monkeypatch):
    """The entry points above loaded into a fresh server registry: (loaded names, the registry)."""
    fresh = Registry.with_built_ins()
    monkeypatch.setattr(registry, "REGISTRY", fresh)
    monkeypatch.setattr(
        plugins, "entry_points", lambda group: [p for p in POINTS if p.group == group]
    )
    return plugins.load_plugins(), fresh


def test_what_each_group_takes_is_loaded(loaded):
    names, reg = loaded
    assert names == [
        "backend reader",
        "backend a-module",
        "backend replacement",
        "question type mood",
    ]
    assert reg.backend_class("reader") is Reader and isinstance(
        reg.question_type("mood"), Mood
    )


def test_anything_else_is_a_failure_with_its_reason(loaded):
    _, reg = loaded
    # the operator's view (startup errors); a response names the plugins only
    note = reg.failures_detail()
    assert (
        reg.failures_note()
        == "; plugins that failed to load (the server's log says why): "
        + ", ".join(reg.failures())
    )
    assert (
        "wrong-group (TypeError: a backend entry point must name a DecisionBackend subclass, a function"
        in note
    )
    assert f"not the class {HERE}.Mood)" in note
    assert "a-module" not in note, (
        "a module registers what it has on import, as the docs have always said"
    )
    assert (
        f"a-backend (TypeError: a question type entry point must name a QuestionType subclass or instance, a function that registers, or a module that registers on import, not the class {HERE}.Reader)"
        in note
    )
    assert (
        "a-string (TypeError: a question type entry point must name" in note
        and "not str 'hello')" in note
    )
    assert reg.question_type("reader") is None and reg.backend_class("mood") is None


def test_a_plugin_taking_a_built_in_name_fails_unless_it_overrides(loaded):
    _, reg = loaded
    assert (
        "clash (ValueError: backend name 'logit' is already taken by the built-in"
        in reg.failures_detail()
    )
    # replace_logit registered it with override=True: then it is logit everywhere.
    assert (
        reg.choose_backend(parse_backend_spec(""), ("GPT2LMHeadModel",)) is PlainLogit
    )
    assert reg.choose_backend(parse_backend_spec("logit"), ()) is PlainLogit


def test_loading_again_changes_nothing(loaded):
    """Registering the same class again is no clash (``clash`` now names the class logit already is)."""
    names, reg = loaded
    assert plugins.load_plugins() == [
        "backend reader",
        "backend a-module",
        "backend clash",
        "backend replacement",
        "question type mood",
    ]
    assert reg.backend_names() == ["canvas", "encoder", "logit", "reader"]
    assert (
        reg.backend_class("logit") is PlainLogit
        and reg.backend_class("reader") is Reader
    )
