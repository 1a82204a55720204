"""A read's context reaches the backend and the host as an argument; backends written for the old
``read(state, question, request_id, options)`` keep working; an order-independent backend reads once."""

from __future__ import annotations

import warnings

import pytest

from tests.unit.asking import ask, read_question
from tests.unit.fakes import ScriptedBackend
from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend, Reading
from vllm.entrypoints.generate.decisions.decide.backends.base import takes_legacy_read
from vllm.entrypoints.generate.decisions.decide.questions import CHOICE, ChoiceQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import (
    ReadContext,
    sha256_of,
)
from vllm.entrypoints.generate.decisions.decide.reading.calls import backend_read
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings, parse_debias


def choice(*values: str):
    return CHOICE.compile(
        ChoiceQuestion(instructions="Which?", criteria={v: None for v in values})
    )


def reading(scores: list[float]) -> Reading:
    return Reading(
        scores=scores,
        forward_passes=1,
        input_tokens=3,
        cached_input_tokens=0,
        readout="direct",
    )


def test_a_context_names_its_state_and_each_part():
    context = ReadContext.about("a ticket", "decision-x-0", {"k": 1})
    assert context.state_sha256 == sha256_of("a ticket")
    part = context.part("r1").part("fallback")
    assert (
        part.request_id == "decision-x-0-r1-fallback"
        and part.state == "a ticket"
        and part.options == {"k": 1}
    )
    neutral = context.with_state("N/A", "decision-x-0-p0-1")
    assert neutral.state_sha256 == sha256_of("N/A") and neutral.options == {"k": 1}


async def test_an_old_style_backend_still_reads_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="read\\(question, context\\)"):

        class OldStyle(DecisionBackend):
            name = "old-style"

            async def read(self, state, question, request_id, options=None):
                self.seen = (state, request_id, options)
                return reading([0.0, -1.0])

    backend = OldStyle(host=None)  # type: ignore[arg-type]
    assert backend.legacy_read
    got = await backend_read(
        backend, choice("a", "b"), ReadContext.about("s", "r-0", "opts")
    )
    assert got.scores == [0.0, -1.0] and backend.seen == ("s", "r-0", "opts")


def test_a_new_style_backend_is_not_legacy():
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class NewStyle(DecisionBackend):
            name = "new-style"

            async def read(self, question, context):
                return reading([0.0] * len(question.options))

    assert not NewStyle.legacy_read and not takes_legacy_read(ScriptedBackend.read)


async def test_the_service_passes_each_question_its_own_context():
    seen: list[ReadContext] = []

    class Recording(ScriptedBackend):
        async def read(self, question, context):
            seen.append(context)
            return await super().read(question, context)

    service = DecisionService(
        Settings.from_env({}), Recording(lambda q: [0.0, -1.0]), "m"
    )
    service.readiness.succeed()
    await service.decide(
        ask("the input", [choice("a", "b"), choice("c", "d")], "abc", debias="off")
    )
    assert sorted(c.request_id for c in seen) == ["decision-abc-0", "decision-abc-1"]
    assert {c.state_sha256 for c in seen} == {sha256_of("the input")}


async def test_an_order_independent_backend_is_read_once_whatever_the_debias():
    class PerOption(ScriptedBackend):
        order_independent = True

        async def read(self, question, context):
            self.reads = getattr(self, "reads", 0) + 1
            return reading(
                [{"a": 0.0, "b": -2.0, "c": -1.0}[o.value] for o in question.options]
            )

    backend = PerOption(lambda q: [])
    question = choice("c", "a", "b")
    read = await read_question(
        backend, question, ReadContext.about("s", "r"), parse_debias("rotate:3")
    )
    assert backend.reads == 1 and read.debias is None
    assert read.reading.scores == [-1.0, 0.0, -2.0]  # in the client's order


async def test_a_types_own_options_limit_is_checked_by_the_setting_it_names():
    from vllm.entrypoints.generate.decisions.decide.errors import OverLimitError
    from vllm.entrypoints.generate.decisions.decide.questions import (
        Option,
        OptionsLimit,
        QuestionModel,
        QuestionType,
    )

    class Tags(QuestionType):
        name = "tags-with-a-limit"
        model = QuestionModel
        options_limit = OptionsLimit("max_choices", "tags")

        def options(self, question):
            return [Option(str(i), i, f"tag {i}") for i in range(5)]

        def answer(self, probabilities, options):
            return {}

    service = DecisionService(
        Settings.from_env({"VLLM_TYPED_DECISIONS_MAX_CHOICES": "4"}),
        ScriptedBackend(lambda q: [0.0] * 5),
        "m",
    )
    service.readiness.succeed()
    with pytest.raises(
        OverLimitError, match=r"questions\[0\] has 5 tags; the limit is 4 .*MAX_CHOICES"
    ):
        await service.decide(ask("s", [Tags().compile(QuestionModel())]))
