"""An example decision plugin: a backend and a question type.

``PlainLettersBackend`` reads the option letters right after the chat template's assistant header,
without the logit backend's answer cue, and claims Qwen2 models. ``SentimentType`` asks for the
sentiment of the input and answers with a label.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from vllm.entrypoints.generate.decisions import (
    CompiledQuestion,
    DecisionBackend,
    DecisionError,
    Option,
    QuestionModel,
    QuestionType,
    Reading,
    standard_messages,
)


class PlainLettersOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Read " A" (after a space) or "A" (straight after the header).
    space: bool = False


class PlainLettersBackend(DecisionBackend[PlainLettersOptions]):
    name = "plain-letters"
    architectures = ("Qwen2ForCausalLM",)
    options_model = PlainLettersOptions
    render_version = "plain-letters-1"

    async def read(
        self,
        state: str,
        question: CompiledQuestion,
        request_id: str,
        options: PlainLettersOptions | None = None,
    ) -> Reading:
        options = options or self.options or PlainLettersOptions()
        letters = [chr(ord("A") + i) for i in range(len(question.options))]
        if len(letters) > 26:
            raise DecisionError(
                f"plain-letters reads at most 26 options, got {len(letters)}"
            )
        prompt = await self.host.render_chat(
            standard_messages(state, question, letters)
        )
        ids = []
        for letter in letters:
            encoded = self.host.encode((" " if options.space else "") + letter)
            if len(encoded) != 1:
                raise DecisionError(f"letter {letter!r} is not one token")
            ids.append(encoded[0])
        read = await self.host.read_token_logprobs(prompt, ids, request_id)
        scores = [read.logprobs.get(t, -math.inf) for t in ids]
        return Reading(
            scores=scores,
            forward_passes=1,
            input_tokens=read.prompt_tokens,
            cached_input_tokens=read.cached_tokens,
            readout="plain-letters",
            option_mass=sum(math.exp(s) for s in scores),
            meta={"space": options.space},
        )


class SentimentQuestion(QuestionModel):
    type: Literal["sentiment"] = "sentiment"
    instructions: str | None = None


class SentimentType(QuestionType):
    name = "sentiment"
    model = SentimentQuestion
    LABELS = ("negative", "neutral", "positive")

    def instructions(self, question: SentimentQuestion) -> str:
        return question.instructions or "What is the overall sentiment of the document?"

    def options(self, question: SentimentQuestion) -> list[Option]:
        return [
            Option(key=label, value=label, text=label.capitalize())
            for label in self.LABELS
        ]

    def answer(self, probabilities, options) -> dict[str, Any]:
        best = max(range(len(options)), key=lambda i: probabilities[i])
        return {
            "label": options[best].value,
            "positive_minus_negative": probabilities[2] - probabilities[0],
        }
