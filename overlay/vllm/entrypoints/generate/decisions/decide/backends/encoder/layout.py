# SPDX-License-Identifier: Apache-2.0
"""A compiled question in Laya's terms: its option texts in Laya's slot order."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion

# What Laya's noul options say when the question gives no criterion.
NOUL_DEFAULTS = {
    "false": "no, the statement does not hold",
    "true": "yes, the statement holds",
}


@dataclass(frozen=True)
class LayaOptions:
    texts: list[str]
    # slots[i]: the slot (marker) of the question's i-th option
    slots: list[int]

    def in_question_order(self, slot_scores: list[float]) -> list[float]:
        return [slot_scores[slot] for slot in self.slots]


def laya_options(question: CompiledQuestion) -> LayaOptions:
    """Options as Laya renders them: noul lists false before true; score levels read ``level i: ...``."""
    options = question.options
    if question.qtype.name == "noul":
        order = ["false", "true"]
        described = {o.key: o.description for o in options}
        texts = [f"{key}: {described.get(key) or NOUL_DEFAULTS[key]}" for key in order]
        return LayaOptions(texts, [order.index(o.key) for o in options])
    if question.qtype.name == "score":
        return LayaOptions(
            [f"level {i}: {o.text}" for i, o in enumerate(options)],
            list(range(len(options))),
        )
    return LayaOptions([o.text for o in options], list(range(len(options))))
