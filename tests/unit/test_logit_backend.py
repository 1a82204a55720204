"""The logit backend's prompt and answer slot, on real tokenizers (no model runs)."""

from __future__ import annotations

import math

import pytest

from vllm.entrypoints.generate.decisions.backends.logit import LogitBackend
from vllm.entrypoints.generate.decisions.backends.logit.answer_slot import ANSWER_CUE, AnswerSlotPlacer
from vllm.entrypoints.generate.decisions.errors import DecisionError
from vllm.entrypoints.generate.decisions.questions import CHOICE, NOUL, ChoiceQuestion, NoulQuestion

from .fakes import TokenizerHost


def letters(n):
    return [chr(ord("A") + i) for i in range(n)]


async def test_each_letter_is_one_token_after_the_cue(any_tokenizer):
    host = TokenizerHost(any_tokenizer)
    rendered = await host.render_chat([{"role": "user", "content": "Pick one."}])
    slot = AnswerSlotPlacer(host).place(rendered, letters(26))
    assert host.decode(slot.prompt_ids).endswith(ANSWER_CUE)
    assert len(set(slot.label_ids)) == 26
    for letter, token in zip(letters(26), slot.label_ids, strict=True):
        # Reading the letter in context leaves the prompt's tokens as they are.
        with_letter = host.encode(host.decode(slot.prompt_ids) + " " + letter)
        assert with_letter == slot.prompt_ids + [token]
        assert host.decode([token]).strip() == letter


async def test_a_label_that_is_not_one_token_is_refused(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    rendered = await host.render_chat([{"role": "user", "content": "Pick one."}])
    with pytest.raises(DecisionError, match="single token"):
        AnswerSlotPlacer(host).place(rendered, ["A", "Xylophonic"])


async def test_read_returns_the_label_log_probabilities(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer, logprob=lambda token: -float(token % 5) - 0.5)
    backend = LogitBackend(host)
    question = CHOICE.compile(ChoiceQuestion(instructions="Which?", criteria={"a": "first", "b": None, "c": None}))
    reading = await backend.read("The state.", question, "r")
    (prompt_ids, label_ids), *_ = host.reads
    assert reading.scores == [-float(t % 5) - 0.5 for t in label_ids]
    assert reading.option_mass == pytest.approx(sum(math.exp(s) for s in reading.scores))
    assert reading.forward_passes == 1 and reading.readout == "direct"
    text = host.decode(prompt_ids)
    assert "The state." in text and "A. a: first" in text and "C. c" in text


async def test_questions_about_one_state_share_the_state_prefix(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    backend = LogitBackend(host)
    state = "A long state. " * 50
    await backend.read(state, NOUL.compile(NoulQuestion(instructions="One?")), "r1")
    await backend.read(
        state, CHOICE.compile(ChoiceQuestion(instructions="Two?", criteria={"x": None, "y": None})), "r2"
    )
    (first, _), (second, _) = host.reads
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert state.rstrip() in host.decode(first[:shared])


async def test_a_prompt_longer_than_the_context_is_refused(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer, max_model_len=64)
    with pytest.raises(DecisionError, match="--max-model-len 64"):
        await LogitBackend(host).read("word " * 100, NOUL.compile(NoulQuestion(instructions="?")), "r")
    assert host.reads == []


async def test_more_options_than_letters_is_refused(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    question = CHOICE.compile(ChoiceQuestion(criteria={f"o{i}": None for i in range(27)}))
    with pytest.raises(DecisionError, match="at most 26"):
        await LogitBackend(host).read("s", question, "r")
