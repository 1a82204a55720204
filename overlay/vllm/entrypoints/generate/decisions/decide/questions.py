# SPDX-License-Identifier: Apache-2.0
"""Question types: each validates its own JSON, lists a closed option set and turns probabilities over
it into answer fields; so a type never sees a backend, and a backend never sees a wire format."""

from __future__ import annotations

import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from vllm.entrypoints.generate.decisions.decide.budget import RenderBudget, check_depth
from vllm.entrypoints.generate.decisions.decide.errors import OverLimitError
from vllm.entrypoints.generate.decisions.decide.settings import PREFIX


@dataclass(frozen=True)
class Option:
    """``key`` names the option in ``option_logits``, ``value`` is what the answer reports, ``text``
    what the prompt shows after its label; ``label`` and ``description`` are for backends whose models
    lay options out their own way."""

    key: str
    value: Any
    text: str
    label: str = ""
    description: str = ""


@dataclass(frozen=True)
class CompiledQuestion:
    qtype: QuestionType
    instructions: str
    options: tuple[Option, ...]
    model: BaseModel | None = None


@dataclass(frozen=True)
class OptionsLimit:
    """The :class:`Settings` field capping a type's options, and what the refusal calls them."""

    setting: str
    noun: str


class QuestionModel(BaseModel):
    """Unknown fields are refused: a typo could change an answer."""

    model_config = ConfigDict(extra="forbid")


# Jev lets instructions and criteria be text or any JSON value.
Content = str | int | float | bool | dict[str, Any] | list[Any]
Instructions = Content | None


_INDENTED = json.JSONEncoder(indent=2, ensure_ascii=False)


def content_text(content: Content | None, budget: RenderBudget | None = None) -> str:
    """A string as it is, any other JSON value as indented JSON, charged to ``budget`` as it renders
    (budget.py says why)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    budget = budget if budget is not None else RenderBudget()
    check_depth(content, budget.max_depth)
    limit = budget.max_value_chars
    chunks, size = [], 0
    try:
        for chunk in _INDENTED.iterencode(content):
            size += len(chunk)
            if size > limit:
                raise OverLimitError(
                    f"a JSON value in the request renders to more than {limit} characters of text "
                    f"(set {PREFIX}MAX_INPUT_CHARS to raise it)"
                )
            budget.charge(len(chunk))
            chunks.append(chunk)
    except RecursionError:  # MAX_JSON_DEPTH set past what Python's stack can render
        raise OverLimitError(
            f"a JSON value in the request nests too deeply to render (lower {PREFIX}MAX_JSON_DEPTH or send it flatter)"
        ) from None
    return "".join(chunks)


def takes_budget(method: Any) -> bool:
    return "budget" in inspect.signature(method).parameters


class QuestionType(ABC):
    """A kind of question: subclasses set ``name`` and ``model`` and implement the two methods. Each
    wire shapes its answers from :meth:`answer`'s fields; a plugin type's go out whole."""

    name: ClassVar[str]
    model: ClassVar[type[BaseModel]]
    # Whether the option order is part of the question (a scale's levels): debiasing then keeps it.
    ordered: ClassVar[bool] = False
    # The setting that caps how many options one question may have (None: only the request's limits).
    options_limit: ClassVar[OptionsLimit | None] = None

    # Whether instructions() and options() take a ``budget``; texts from a plugin's that don't are
    # charged once made.
    budgeted: ClassVar[tuple[bool, bool]] = (True, True)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.budgeted = (takes_budget(cls.instructions), takes_budget(cls.options))

    def instructions(self, question: Any, budget: RenderBudget | None = None) -> str:
        return content_text(getattr(question, "instructions", None), budget)

    @abstractmethod
    def options(
        self, question: Any, budget: RenderBudget | None = None
    ) -> Sequence[Option]:
        """The closed option set, in the order the prompt lists it."""

    @abstractmethod
    def answer(
        self, probabilities: Sequence[float], options: Sequence[Option]
    ) -> dict[str, Any]:
        """The type's own answer fields for calibrated probabilities over ``options``."""

    def compile(
        self, question: BaseModel, budget: RenderBudget | None = None
    ) -> CompiledQuestion:
        """The question as backends read it, rendered within ``budget``."""
        budget = budget if budget is not None else RenderBudget()
        with_instructions, with_options = self.budgeted
        spend = {"budget": budget}
        instructions = self.instructions(
            question, **(spend if with_instructions else {})
        )
        options = tuple(self.options(question, **(spend if with_options else {})))
        budget.charge(
            (0 if with_instructions else len(instructions))
            + (0 if with_options else sum(len(option.text) for option in options))
        )
        compiled = CompiledQuestion(self, instructions, options, question)
        return within(compiled, budget.max_value_chars)


def within(question: CompiledQuestion, max_chars: int) -> CompiledQuestion:
    """``question``, refused if any of its texts is over ``max_chars``."""
    longest = max(
        [len(question.instructions), *(len(o.text) for o in question.options)]
    )
    if longest > max_chars:
        raise OverLimitError(
            f"a question's text is {longest} characters; the limit is {max_chars} "
            f"(set {PREFIX}MAX_INPUT_CHARS to raise it)"
        )
    return question


def top_index(probabilities: Sequence[float]) -> int:
    """Index of the most probable option (the first one on a tie)."""
    return max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))


class NoulCriteria(QuestionModel):
    true: Content | None = None
    false: Content | None = None


class NoulQuestion(QuestionModel):
    type: Literal["noul"] = "noul"
    instructions: Instructions = None
    criteria: NoulCriteria | None = None


def yes_no_options(
    when_yes: Content | None = None,
    when_no: Content | None = None,
    budget: RenderBudget | None = None,
) -> tuple[Option, Option]:
    def option(key: str, value: bool, word: str, when: Content | None) -> Option:
        description = content_text(when, budget)
        text = f"{word}: {description}" if description else word
        return Option(key, value, text, word.lower(), description)

    return option("true", True, "Yes", when_yes), option("false", False, "No", when_no)


class NoulType(QuestionType):
    name = "noul"
    model = NoulQuestion

    def options(
        self, question: NoulQuestion, budget: RenderBudget | None = None
    ) -> Sequence[Option]:
        criteria = question.criteria or NoulCriteria()
        return yes_no_options(criteria.true, criteria.false, budget)

    def answer(
        self, probabilities: Sequence[float], options: Sequence[Option]
    ) -> dict[str, Any]:
        return {"probability": probabilities[0]}


class ChoiceQuestion(QuestionModel):
    type: Literal["choice"] = "choice"
    instructions: Instructions = None
    criteria: dict[str, Content | None] = Field(min_length=2)


def choice_options(
    items: Sequence[tuple[StrictStr | StrictBool, Content | None]],
    budget: RenderBudget | None = None,
) -> tuple[Option, ...]:
    """Options for choice values (strings or booleans, kept typed), described or not."""
    options = []
    for value, content in items:
        shown = value if isinstance(value, str) else json.dumps(value)
        description = content_text(content, budget)
        text = f"{shown}: {description}" if description else shown
        key = json.dumps(value, ensure_ascii=False)
        options.append(Option(key, value, text, shown, description))
    return tuple(options)


class ChoiceType(QuestionType):
    name = "choice"
    model = ChoiceQuestion
    options_limit = OptionsLimit("max_choices", "choices")

    def options(
        self, question: ChoiceQuestion, budget: RenderBudget | None = None
    ) -> Sequence[Option]:
        return choice_options(list(question.criteria.items()), budget)

    def answer(
        self, probabilities: Sequence[float], options: Sequence[Option]
    ) -> dict[str, Any]:
        return {"choice": options[top_index(probabilities)].value}


class ScoreQuestion(QuestionModel):
    type: Literal["score"] = "score"
    instructions: Instructions = None
    # Levels, lowest first; the map form some clients send is refused (its order is not a scale).
    criteria: list[Content] = Field(min_length=2)


def level_options(levels: Sequence[tuple[str, str | None]]) -> tuple[Option, ...]:
    """Options for ordered levels, lowest first."""
    return tuple(
        Option(
            str(i),
            i,
            f"{label}: {description}" if description else label,
            label,
            description or "",
        )
        for i, (label, description) in enumerate(levels)
    )


class ScoreType(QuestionType):
    name = "score"
    model = ScoreQuestion
    ordered = True
    options_limit = OptionsLimit("max_levels", "levels")

    def options(
        self, question: ScoreQuestion, budget: RenderBudget | None = None
    ) -> Sequence[Option]:
        return level_options(
            [(content_text(level, budget), None) for level in question.criteria]
        )

    def answer(
        self, probabilities: Sequence[float], options: Sequence[Option]
    ) -> dict[str, Any]:
        return {"score": sum(i * p for i, p in enumerate(probabilities))}


NOUL = NoulType()
CHOICE = ChoiceType()
SCORE = ScoreType()
