# SPDX-License-Identifier: Apache-2.0
"""The logit backend's prompt: the state first, so every question about one state shares a token prefix
that vLLM's prefix cache prefills once; then the criterion and labelled options.

A yes/no question in words has a frame of its own (``Text:``, plain Yes or No asked for, ``Yes: ...``
criteria, no options list): small models read it better (docs/quality.md, "A yes/no frame"). Answered
examples, where kept, come before the state, as a prefix shared by that question's reads.
``RENDER_VERSION`` is a hash of a fixed probe rendered by this code, so any change to the text is a new
version and saved calibrations of the old text are not reused; tests/golden pins the full prompts."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import ANSWER_CUE
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    SCORE,
    ChoiceQuestion,
    CompiledQuestion,
    NoulCriteria,
    NoulQuestion,
    Option,
    ScoreQuestion,
    yes_no_options,
)

SYSTEM_PROMPT = (
    "You answer questions about a document. Each question lists its options. "
    "Reply with the label of the one option that fits best, and nothing else."
)
YES_NO_SYSTEM_PROMPT = "Read the text and answer Yes or No."


@dataclass(frozen=True)
class Frame:
    """What a prompt puts around the state and the question."""

    yes_no: bool = False

    @property
    def instructions(self) -> str:
        return YES_NO_SYSTEM_PROMPT if self.yes_no else SYSTEM_PROMPT

    @property
    def heading(self) -> str:
        return "Text" if self.yes_no else "Document"


DOCUMENT_FRAME = Frame()
YES_NO_FRAME = Frame(yes_no=True)


def frame_for(question: CompiledQuestion, words: bool) -> Frame:
    return (
        YES_NO_FRAME if words and question.qtype.name == NOUL.name else DOCUMENT_FRAME
    )


def answer_instruction(
    labels: Sequence[str], words: bool = False, numbered: bool = False
) -> str:
    if numbered:
        numbers = sorted(int(label) for label in labels)
        return f"Answer with one number ({numbers[0]}-{numbers[-1]})."
    if words:
        if len(labels) == 2:
            return f"Answer with {labels[0]} or {labels[1]}."
        return f"Answer with one of: {', '.join(labels)}."
    if all(len(label) == 1 for label in labels):
        return f"Answer with one letter ({labels[0]}-{labels[-1]})."
    return f"Answer with the label of one option ({labels[0]}-{labels[-1]})."


def option_line(label: str, option: Option, words: bool = False) -> str:
    """One option's line: ``A. text`` (letters, and numbered levels), ``- word: text`` (words)."""
    text = option.text
    if not words:
        return f"{label}. {text}"
    if text == label or text.startswith(f"{label}: "):
        return f"- {text}"
    return f"- {label}: {text}"


def question_text(
    question: CompiledQuestion, labels: Sequence[str], words: bool = False
) -> str:
    """The question's text with ``labels``, of the words layout (labels.py) with ``words``."""
    if frame_for(question, words).yes_no:
        return "\n".join(
            [f"Question: {question.instructions}".rstrip()]
            + [
                f"{option.text}{'' if option.text[-1] in '.!?' else '.'}"
                for option in question.options
                if option.description
            ]
        )
    numbered = words and question.qtype.ordered
    word_lines = words and not numbered
    lines = [f"Question: {question.instructions}".rstrip(), "", "Options:"]
    lines += [
        option_line(label, option, word_lines)
        for label, option in zip(labels, question.options, strict=True)
    ]
    lines += ["", answer_instruction(labels, word_lines, numbered)]
    return "\n".join(lines)


@dataclass(frozen=True)
class Shown:
    """An answered example as a prompt shows it, in the read's labels."""

    state: str
    question_body: str
    answer: str


def messages(
    state: str,
    question: CompiledQuestion,
    labels: Sequence[str],
    system_role: bool = True,
    words: bool = False,
    examples: Sequence[Shown] = (),
) -> list[dict[str, str]]:
    return chat(
        state,
        question_text(question, labels, words),
        system_role,
        examples,
        frame_for(question, words),
    )


def chat(
    state: str,
    question_body: str,
    system_role: bool = True,
    examples: Sequence[Shown] = (),
    frame: Frame = DOCUMENT_FRAME,
) -> list[dict[str, str]]:
    """The instructions go in a system message or, for chat templates with no system role (they refuse
    one or drop it), at the head of the first user turn."""
    turns = []
    for shown in examples:
        content = user_turn(shown.state, shown.question_body, frame)
        turns.append({"role": "user", "content": content})
        turns.append({"role": "assistant", "content": f"{ANSWER_CUE} {shown.answer}"})
    turns.append({"role": "user", "content": user_turn(state, question_body, frame)})
    if not system_role:
        turns[0]["content"] = f"{frame.instructions}\n\n{turns[0]['content']}"
        return turns
    return [{"role": "system", "content": frame.instructions}, *turns]


def user_turn(state: str, question_body: str, frame: Frame = DOCUMENT_FRAME) -> str:
    return f"{frame.heading}:\n{state}\n\n{question_body}"


def option_check(question: CompiledQuestion, option: Option) -> CompiledQuestion:
    """Two-stage's first stage: does this one option fit the question? (yes/no, same state prefix)"""
    instructions = (
        f"{question.instructions}\nDoes this option fit: {option.text}".strip()
    )
    return CompiledQuestion(NOUL, instructions, yes_no_options())


def probe_rendering() -> str:
    """What the render version hashes: each question type in every layout and placement."""
    from vllm.entrypoints.generate.decisions.decide.prompting.labels import (
        MARKERS,
        word_labels,
    )

    questions = [
        NOUL.compile(
            NoulQuestion(
                instructions="Is this urgent?",
                criteria=NoulCriteria(true="time-sensitive"),
            )
        ),
        CHOICE.compile(
            ChoiceQuestion(
                instructions="Which team?",
                criteria={"billing": "Payments", "tech": None},
            )
        ),
        SCORE.compile(
            ScoreQuestion(
                instructions={"rate": "mood"}, criteria=["Calm", "Angry", "Furious"]
            )
        ),
    ]
    doc = "Probe document."
    rendered: list[object] = [ANSWER_CUE]
    for question in questions:
        letters = list(MARKERS[: len(question.options)])
        words = word_labels(question)
        check = option_check(question, question.options[0])
        answered = Shown("Probe example.", question_text(question, letters), "B")
        for role in (True, False):
            rendered.append(messages(doc, question, letters, role))
            if words is not None:
                rendered.append(messages(doc, question, words, role, words=True))
            rendered.append(messages(doc, check, ["A", "B"], role))
            rendered.append(messages(doc, question, letters, role, examples=[answered]))
    return json.dumps(rendered, ensure_ascii=False)


RENDER_VERSION = "direct-" + hashlib.sha256(probe_rendering().encode()).hexdigest()[:12]
