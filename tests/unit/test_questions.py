from __future__ import annotations

import pytest
from pydantic import ValidationError

from vllm.entrypoints.generate.decisions.decide.backends.registry import (
    question_type,
    register_question_type,
)
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    SCORE,
    ChoiceQuestion,
    NoulQuestion,
    Option,
    QuestionType,
    ScoreQuestion,
    choice_options,
    content_text,
)


def test_noul_options_are_yes_then_no_with_criteria():
    q = NOUL.compile(
        NoulQuestion(instructions="Urgent?", criteria={"true": "time-sensitive"})
    )
    assert [o.key for o in q.options] == ["true", "false"]
    assert [o.text for o in q.options] == ["Yes: time-sensitive", "No"]
    assert NOUL.answer([0.8, 0.2], q.options) == {"probability": 0.8}


def test_choice_keys_are_json_text_and_values_stay_typed():
    options = choice_options([("billing", "Payments"), (True, None), ("true", None)])
    assert [o.key for o in options] == ['"billing"', "true", '"true"']
    assert [o.value for o in options] == ["billing", True, "true"]
    assert [o.text for o in options] == ["billing: Payments", "true", "true"]
    assert CHOICE.answer([0.1, 0.7, 0.2], options)["choice"] is True


def test_choice_answer_takes_first_option_on_a_tie():
    options = CHOICE.compile(ChoiceQuestion(criteria={"a": None, "b": None})).options
    assert CHOICE.answer([0.5, 0.5], options)["choice"] == "a"


def test_score_is_probability_weighted_level_index():
    q = SCORE.compile(
        ScoreQuestion(instructions="How?", criteria=["Calm", "Frustrated", "Angry"])
    )
    answer = SCORE.answer([0.2, 0.3, 0.5], q.options)
    assert answer == {"score": pytest.approx(0.3 + 1.0)}


def test_unknown_question_fields_are_refused():
    with pytest.raises(ValidationError):
        NoulQuestion.model_validate(
            {"type": "noul", "instructions": "x", "critera": {}}
        )


def test_json_content_renders_as_indented_json():
    assert content_text({"ask": "urgent?"}) == '{\n  "ask": "urgent?"\n}'
    assert content_text(None) == ""


def test_reserved_names_cannot_be_registered():
    class Predicate(QuestionType):
        name = "predicate"
        model = NoulQuestion

        def options(self, question):
            return [Option("a", "a", "a")]

        def answer(self, probabilities, options):
            return {}

    with pytest.raises(ValueError, match="reserved"):
        register_question_type(Predicate)
    assert question_type("predicate") is None


def test_json_content_renders_as_indented_json_and_stops_at_the_limit():
    import json

    from vllm.entrypoints.generate.decisions.decide.budget import RenderBudget
    from vllm.entrypoints.generate.decisions.decide.errors import DecisionError

    value = {
        "ticket": {"id": 7, "tags": ["a", "é"], "nested": {"deep": [1.5, None, True]}}
    }
    assert content_text(value) == json.dumps(value, indent=2, ensure_ascii=False)
    deep: dict = {}
    for _ in range(300):
        deep = {"a": deep}  # about 2 KB of JSON that renders to about 90,000 characters
    # the default limit (1,000,000) lets it through
    assert len(content_text(deep)) > 10_000
    with pytest.raises(DecisionError, match="VLLM_TYPED_DECISIONS_MAX_INPUT_CHARS"):
        content_text(deep, RenderBudget(max_value_chars=10_000))
    question = ScoreQuestion(instructions=deep, criteria=["low", "high"])
    assert len(SCORE.compile(question).instructions) > 10_000
    with pytest.raises(DecisionError, match="more than 10000 characters"):
        # the server's limit, passed by the wire
        SCORE.compile(question, RenderBudget(max_value_chars=10_000))
