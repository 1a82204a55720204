# SPDX-License-Identifier: Apache-2.0
"""The logit backend's prompt: the state first, then the criterion, then labelled options.

The state comes first so that every question about one state shares a token prefix, which vLLM's
prefix cache then prefills once. Every question is framed alike (the same instructions, the state
under ``Document:``) except a yes/no question in words: a small model reads a plain Yes or No asked
for in the instructions, the state as ``Text:`` and the criteria as ``Yes: ...`` and ``No: ...``
better than an options list (docs/quality.md, "A yes/no frame"), so those questions share the state's
prefix with each other, not with the rest. The instructions go in a system message, or, for
chat templates with no system role (they refuse one or drop it), at the head of the user turn
(``system_role=False``). ``RENDER_VERSION`` names this exact text: it is derived from it, a hash of
a fixed probe (a question of each type, both label layouts, both instruction placements, the two-stage
check and the answer cue) rendered by this code, so any change to the text is a new version, and
saved calibrations measured with the old text are not reused. tests/golden pins the full prompts byte
for byte under the version's name.

Options are listed by layout (labels.py): letters as ``A. text``; words as ``- word: description``,
or, for an ordered scale, numbered ``1. text``; a yes/no question in words says what each answer
means, ``Yes: description.``, with no list and no answer instruction (its frame's instructions ask).

A question the operator labelled may be asked with answered examples (in-context examples): earlier
turns asking the same question about other documents, each answered ``Answer: <label>`` in the read's
own labels, ahead of the document. They come before the state, so every read of that question shares
them as a prefix (a question's reads no longer share the state's prefix with other questions).
"""

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
    """What a prompt puts around the state and the question: the instructions and the state's
    heading (see the module's docstring for why yes/no questions in words have a frame of their own)."""

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
    """The frame ``question`` is asked in, in words (``words``) or in letters."""
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
    if not words:
        return f"{label}. {option.text}"
    text = option.text
    return (
        f"- {text}"
        if text == label or text.startswith(f"{label}: ")
        else f"- {label}: {text}"
    )


def question_text(
    question: CompiledQuestion, labels: Sequence[str], words: bool = False
) -> str:
    """The question's text with ``labels``; ``words``: they are the words layout's (labels.py)."""
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
    """An answered example as a prompt shows it: its document, the question's text in the read's
    labels, and the label of its answer."""

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
    """Chat messages for one question; everything before the question text depends only on the
    examples, the state and the question's frame."""
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
    """The chat around a question's text: the frame's instructions, the answered ``examples`` (a user
    turn and the assistant's answer each), then the state and ``question_body``."""
    turns = []
    for shown in examples:
        turns.append(
            {
                "role": "user",
                "content": user_turn(shown.state, shown.question_body, frame),
            }
        )
        turns.append({"role": "assistant", "content": f"{ANSWER_CUE} {shown.answer}"})
    turns.append({"role": "user", "content": user_turn(state, question_body, frame)})
    if not system_role:
        turns[0] = {
            "role": "user",
            "content": f"{frame.instructions}\n\n{turns[0]['content']}",
        }
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
    """The probe the render version is a hash of: a question of each type in every layout this module
    renders, both instruction placements, the two-stage check and the answer cue."""
    from vllm.entrypoints.generate.decisions.decide.prompting.labels import (
        MARKERS,
        word_labels,
    )

    questions = [
        NOUL.compile(
            NoulQuestion.model_validate(
                {
                    "instructions": "Is this urgent?",
                    "criteria": {"true": "time-sensitive"},
                }
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
    rendered: list[object] = [ANSWER_CUE]
    for question in questions:
        letters = list(MARKERS[: len(question.options)])
        words = word_labels(question)
        check = option_check(question, question.options[0])
        for system_role in (True, False):
            rendered.append(messages("Probe document.", question, letters, system_role))
            if words is not None:
                rendered.append(
                    messages(
                        "Probe document.", question, words, system_role, words=True
                    )
                )
            rendered.append(messages("Probe document.", check, ["A", "B"], system_role))
            answered = Shown("Probe example.", question_text(question, letters), "B")
            rendered.append(
                messages(
                    "Probe document.",
                    question,
                    letters,
                    system_role,
                    examples=[answered],
                )
            )
    return json.dumps(rendered, ensure_ascii=False)


RENDER_VERSION = "direct-" + hashlib.sha256(probe_rendering().encode()).hexdigest()[:12]
