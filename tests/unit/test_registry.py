"""The registry's rules: a name is taken once (override on purpose only, and then everywhere), built-ins
known by identity, built-in backends imported only when looked up or chosen (pure logic, plus one
real request through the Jev wire)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fastapi import FastAPI

from vllm.entrypoints.generate.decisions.decide.backends import (
    DecisionBackend,
    LogitBackend,
    registry,
)
from vllm.entrypoints.generate.decisions.decide.backends.registry import Registry
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    ChoiceType,
    NoulQuestion,
    Option,
    QuestionType,
)
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import (
    Settings,
    SettingsError,
    parse_backend_spec,
)
from vllm.entrypoints.generate.decisions.http.api_router import (
    register_decisions_api_router,
)

from .fakes import ScriptedBackend
from .test_wire import decide, descending, systemone

UNSET = parse_backend_spec("")


def backend(name: str, architectures: tuple[str, ...] = ()) -> type[DecisionBackend]:
    """A backend class of its own (each call a new class) registered as ``name``."""

    class Plugin(DecisionBackend):
        async def read(self, state, question, request_id, options=None):
            raise NotImplementedError

    Plugin.name, Plugin.architectures = name, architectures
    return Plugin


class Sentiment(QuestionType):
    name = "sentiment"
    model = NoulQuestion

    def options(self, question):
        return [Option("a", "a", "a"), Option("b", "b", "b")]

    def answer(self, probabilities, options):
        return {}


class PluginChoice(ChoiceType):
    """A plugin's own ``choice``: the built-in's options, an answer field of its own."""

    def answer(self, probabilities, options):
        return {**super().answer(probabilities, options), "picked_by": "plugin"}


@pytest.fixture
def server_registry(monkeypatch):
    """A fresh server registry for one test: what the plugin API and the wires use."""
    fresh = Registry.with_built_ins()
    monkeypatch.setattr(registry, "REGISTRY", fresh)
    return fresh


# --- one name, one backend --------------------------------------------------------------------


def test_a_duplicate_backend_name_is_refused_and_the_first_stays():
    reg = Registry.with_built_ins()
    first, second = backend("mine"), backend("mine")
    reg.register_backend(first)
    with pytest.raises(
        ValueError,
        match=r"'mine' is already taken by .*Plugin; register with override=True",
    ):
        reg.register_backend(second)
    assert reg.backend_class("mine") is first


def test_registering_the_same_backend_again_changes_nothing():
    reg = Registry.with_built_ins()
    mine = backend("mine")
    assert reg.register_backend(mine) is reg.register_backend(mine) is mine
    assert reg.backend_names() == ["canvas", "encoder", "logit", "mine"]


def test_override_replaces_a_backend_on_purpose():
    reg = Registry.with_built_ins()
    first, second = backend("mine"), backend("mine")
    reg.register_backend(first)
    reg.register_backend(second, override=True)
    assert reg.backend_class("mine") is second


def test_a_plugin_logit_is_refused_unless_it_overrides_and_then_serves_everywhere():
    reg = Registry.with_built_ins()
    plugin_logit = backend("logit")
    with pytest.raises(
        ValueError, match=r"already taken by the built-in .*LogitBackend"
    ):
        reg.register_backend(plugin_logit)
    assert reg.choose_backend(UNSET, ("GPT2LMHeadModel",)) is LogitBackend

    reg.register_backend(plugin_logit, override=True)
    assert (
        reg.choose_backend(parse_backend_spec("logit"), ("GPT2LMHeadModel",))
        is plugin_logit
    )
    assert reg.choose_backend(UNSET, ("GPT2LMHeadModel",)) is plugin_logit, (
        "the default choice is the same class"
    )
    assert reg.backend_class("logit") is plugin_logit

    reg.unregister_backend("logit")
    assert reg.choose_backend(UNSET, ("GPT2LMHeadModel",)) is LogitBackend, (
        "the built-in comes back"
    )
    reg.unregister_backend("logit")
    assert reg.backend_class("logit") is LogitBackend, "built-ins stay"


def test_the_decorator_form_overrides_in_the_server_registry(server_registry):
    @registry.register_backend(override=True)
    class Replacement(DecisionBackend):
        name = "logit"

        async def read(self, state, question, request_id, options=None):
            raise NotImplementedError

    @registry.register_backend
    class Extra(DecisionBackend):
        name = "extra"

        async def read(self, state, question, request_id, options=None):
            raise NotImplementedError

    assert registry.choose_backend(UNSET, ()) is Replacement
    assert registry.backend_class("extra") is Extra
    assert not server_registry.is_built_in_backend(Replacement)


def test_a_plugin_that_replaced_a_built_in_claims_like_any_plugin():
    """Built-in by identity: a replacement named like a built-in still wins an architecture claim."""
    reg = Registry.with_built_ins()
    encoder_like = backend("encoder", ("LayaForDecision",))
    reg.register_backend(encoder_like, override=True)
    other = backend("other", ("LayaForDecision",))
    reg.register_backend(other)
    assert reg.choose_backend(UNSET, ("LayaForDecision",)) is encoder_like
    assert reg.is_built_in_backend(LogitBackend) and not reg.is_built_in_backend(
        encoder_like
    )


def test_what_is_not_a_backend_is_refused():
    reg = Registry.with_built_ins()
    with pytest.raises(TypeError, match="DecisionBackend subclass"):
        reg.register_backend(Sentiment)  # type: ignore[type-var]
    with pytest.raises(
        SettingsError, match="unknown backend; registered: canvas, encoder, logit"
    ):
        reg.choose_backend(parse_backend_spec("nope"), ())


# --- question types ---------------------------------------------------------------------------


def test_a_duplicate_question_type_name_is_refused():
    reg = Registry.with_built_ins()
    with pytest.raises(
        ValueError,
        match=r"'choice' is already taken by the built-in ChoiceType; register with",
    ):
        reg.register_question_type(PluginChoice)
    assert reg.question_type("choice") is CHOICE

    first = reg.register_question_type(Sentiment)
    assert reg.register_question_type(Sentiment) is first, (
        "the same type again changes nothing"
    )
    assert reg.register_question_type(first) is first

    class OtherSentiment(Sentiment):
        pass

    with pytest.raises(ValueError, match="'sentiment' is already taken by Sentiment"):
        reg.register_question_type(OtherSentiment())
    assert reg.register_question_type(
        OtherSentiment, override=True
    ) is reg.question_type("sentiment")
    assert isinstance(reg.question_type("sentiment"), OtherSentiment)


def test_built_in_question_types_are_known_by_identity():
    reg = Registry.with_built_ins()
    assert reg.built_in_question_type("choice") and reg.built_in_question_type(CHOICE)
    plugin = reg.register_question_type(PluginChoice, override=True)
    assert not reg.built_in_question_type("choice"), (
        "the name now means the plugin's type"
    )
    assert not reg.built_in_question_type(plugin)
    assert reg.built_in_question_type(CHOICE), "the built-in object stays built-in"
    assert not reg.built_in_question_type(ChoiceType()), (
        "another instance of the built-in class is not it"
    )
    assert not reg.built_in_question_type("sentiment")


def test_what_is_not_a_question_type_is_refused():
    reg = Registry.with_built_ins()
    with pytest.raises(TypeError, match="QuestionType subclass or instance"):
        reg.register_question_type(LogitBackend)  # type: ignore[arg-type]


async def scripted_app() -> FastAPI:
    app = FastAPI()
    register_decisions_api_router(app)
    app.state.decision_service = DecisionService(
        Settings.from_env({}), ScriptedBackend(descending), "served-model"
    )
    await app.state.decision_service.start()
    return app


async def test_a_plugin_choice_gets_the_plugin_answer_shape_on_the_jev_wire(
    server_registry,
):
    app = await scripted_app()
    body = {
        "state": "Ticket: payouts failing.",
        "questions": {
            "team": {
                "type": "choice",
                "criteria": {"billing": "Payments", "tech": None},
            }
        },
    }

    built_in = (await systemone(app, body))["answers"]["team"]
    assert built_in["choice"] == "billing" and "picked_by" not in built_in
    assert set(built_in["probabilities"]) == {"billing", "tech"}, (
        "Jev's choice shape: by value"
    )
    registry.register_question_type(PluginChoice, override=True)
    plugin = (await systemone(app, body))["answers"]["team"]
    assert plugin["choice"] == "billing" and plugin["picked_by"] == "plugin"
    assert set(plugin["probabilities"]) == {'"billing"', '"tech"'}, (
        "a plugin answer's: by option key"
    )


async def test_openai_choice_keeps_its_shape_when_a_plugin_replaced_choice(
    server_registry,
):
    """OpenAI's ``choice`` is the wire's own type, compiled to the built-in one whatever is registered."""
    app = await scripted_app()
    registry.register_question_type(PluginChoice, override=True)
    body = {
        "model": "m",
        "input": "Ticket: payouts failing.",
        "questions": [
            {
                "type": "choice",
                "instructions": "Which team?",
                "choices": [{"value": "billing"}, {"value": "tech"}],
            }
        ],
    }
    answer = (await decide(app, body))["answers"][0]
    assert isinstance(answer["probabilities"], list), (
        "OpenAI's choice shape: a list of {value, probability}"
    )
    assert [p["value"] for p in answer["probabilities"]] == ["billing", "tech"]


# --- built-in backends load when needed -------------------------------------------------------

BACKEND_MODULES = ("logit", "encoder", "canvas")


def imported_backends(code: str) -> list[str]:
    """The built-in backend packages a fresh interpreter has imported after running ``code``."""
    probe = (
        f"{code}\nimport json, sys\n"
        "prefix = 'vllm.entrypoints.generate.decisions.decide.backends.'\n"
        f"print(json.dumps(sorted(m[len(prefix):] for m in sys.modules if m[len(prefix):] in {BACKEND_MODULES!r} and m.startswith(prefix))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_registry_imports_no_backend():
    settings_only = (
        "import vllm.entrypoints.generate.decisions.decide.backends.registry\n"
        "from vllm.entrypoints.generate.decisions.decide.settings import check_environment\n"
        "check_environment({'VLLM_ENABLE_TYPED_DECISIONS': '1'})\n"
        "from vllm.entrypoints.generate.decisions.decide.backends.registry import backend_names\n"
        "assert backend_names() == ['canvas', 'encoder', 'logit'], backend_names()"
    )
    assert imported_backends(settings_only) == []


def test_a_backend_is_imported_when_looked_up_and_all_when_the_default_is_chosen():
    lookup = "from vllm.entrypoints.generate.decisions.decide.backends.registry import backend_class\nbackend_class('encoder')"
    assert imported_backends(lookup) == ["encoder"]
    choose = (
        "from vllm.entrypoints.generate.decisions.decide.backends.registry import choose_backend\n"
        "from vllm.entrypoints.generate.decisions.decide.settings import parse_backend_spec\n"
        "assert choose_backend(parse_backend_spec(''), ('LayaForDecision',)).name == 'encoder'"
    )
    assert imported_backends(choose) == ["canvas", "encoder", "logit"]
