"""A question as a vLLM user words it without our overlay, and the letter-logprob read they build
from it: render the chat template themselves, ask POST /v1/completions for one token with its top
log-probabilities, and read the option letters among them. The ``letters`` row of
tools/quality/accuracy.py and the ``letter logprobs`` rows of tools/quality/labels.py; their docstrings
say how it is scored."""

from __future__ import annotations

import functools
import math
import string
from collections.abc import Mapping
from typing import Any

from vllm.entrypoints.generate.decisions.calibration import question_file
from vllm.entrypoints.generate.decisions.decide.questions import (
    NOUL,
    SCORE,
    CompiledQuestion,
)

# vLLM's default --max-logprobs: the most top log-probabilities a server returns unless raised.
TOP_LOGPROBS = 20
# The least probability an option gets: one the generation row didn't generate, a letter absent
# from the top tokens; so a certain wrong answer has a finite log loss.
MASS_FLOOR = 1e-6
SYSTEM = "You answer questions about a document."


def plain_keys(question: CompiledQuestion) -> list[str]:
    """The options as a user writes them: ``yes``/``no``, the choice values, a score's level numbers."""
    if question.qtype is NOUL:
        return ["yes", "no"]
    if question.qtype is SCORE:
        return [option.key for option in question.options]
    return [option.label for option in question.options]


def option_texts(question: CompiledQuestion) -> list[str]:
    """Each option's plain key and what the question says it means (a description, a level's label)."""
    texts = []
    for key, option in zip(plain_keys(question), question.options, strict=True):
        meaning = option.label if question.qtype is SCORE else option.description
        texts.append(f"{key}: {meaning}" if meaning else key)
    return texts


def letter_messages(item: question_file.LabelledQuestion) -> list[dict[str, str]]:
    """The chat a user writes: the document, the question, its options lettered in option order."""
    question = item.question
    count = len(question.options)
    if count > len(string.ascii_uppercase):
        raise ValueError(f"{count} options: more than there are letters")
    letters = string.ascii_uppercase[:count]
    lines = [f"Document:\n{item.state}", ""]
    if question.instructions:
        lines.append(f"Question: {question.instructions}")
    if question.qtype is SCORE:
        lines.append("Levels, lowest first:")
    lines += [
        f"{letter}. {text}"
        for letter, text in zip(letters, option_texts(question), strict=True)
    ]
    lines += ["", f"Answer with one letter (A-{letters[-1]})."]
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "\n".join(lines)},
    ]


def letter_scores(top: Mapping[str, float], count: int) -> list[float]:
    """Log-probabilities of the first ``count`` letters from one token's top log-probabilities.

    ``A`` and `` A`` are the same answer: their probabilities add. A letter absent from the top
    tokens gets the mass the top tokens leave, shared by the absent letters, at most the least shown
    token's (it ranked below every shown one) and at least MASS_FLOOR (so a certain wrong answer
    has a finite log loss)."""
    shown = []
    for letter in string.ascii_uppercase[:count]:
        spellings = [top[s] for s in (letter, " " + letter) if s in top]
        shown.append(
            math.log(sum(math.exp(lp) for lp in spellings)) if spellings else None
        )
    absent = shown.count(None)
    if not absent:
        return [s for s in shown if s is not None]
    probabilities = [math.exp(lp) for lp in top.values()]
    rest = max(1.0 - sum(probabilities), 0.0) / absent
    floor = math.log(max(min(rest, min(probabilities, default=1.0)), MASS_FLOOR))
    return [floor if s is None else s for s in shown]


@functools.cache
def tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def letter_prompt(item: question_file.LabelledQuestion, model_path: str) -> str:
    """The chat rendered by the model folder's own template, ready for the assistant's turn."""
    return tokenizer(model_path).apply_chat_template(
        letter_messages(item), tokenize=False, add_generation_prompt=True
    )
