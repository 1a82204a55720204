"""The logit backend's label layouts: letters (the default and every question's fallback) and words (each
option's own word where it is one token at the answer slot), on real tokenizers with scripted
log-probabilities (no model runs)."""

from __future__ import annotations

import math

import pytest
from transformers import AutoTokenizer

from vllm.entrypoints.generate.decisions.decide.backends.logit import LogitBackend
from vllm.entrypoints.generate.decisions.decide.backends.logit.backend import (
    describe_prompt,
)
from vllm.entrypoints.generate.decisions.decide.backends.logit.options import (
    LogitOptions,
)
from vllm.entrypoints.generate.decisions.decide.backends.registry import backend_options
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import (
    ANSWER_CUE,
    AnswerSlotPlacer,
)
from vllm.entrypoints.generate.decisions.decide.prompting.labels import word_labels
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import (
    SYSTEM_PROMPT,
    YES_NO_SYSTEM_PROMPT,
    messages,
    question_text,
)
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    SCORE,
    ChoiceQuestion,
    CompiledQuestion,
    NoulQuestion,
    ScoreQuestion,
    choice_options,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.settings import (
    Settings,
    parse_backend_spec,
)

from ..conftest import model_path
from .fakes import TokenizerHost

WORDS = LogitOptions(labels="words", logprobs="exact")
DIGITS = [str(i) for i in range(1, 10)]


def yes_no(when_yes=None, when_no=None):
    criteria = {"true": when_yes, "false": when_no}
    criteria = {key: text for key, text in criteria.items() if text}
    return NOUL.compile(
        NoulQuestion(instructions="Is this urgent?", criteria=criteria or None)
    )


def score(*levels):
    return SCORE.compile(
        ScoreQuestion(instructions="How frustrated?", criteria=list(levels))
    )


def choice(**criteria):
    return CHOICE.compile(ChoiceQuestion(instructions="Which team?", criteria=criteria))


def reversed_options(question: CompiledQuestion) -> CompiledQuestion:
    return CompiledQuestion(
        question.qtype, question.instructions, question.options[::-1], question.model
    )


@pytest.fixture(scope="module")
def local_tokenizer():
    """A tiny byte-level BPE whose vocabulary keeps " 1" whole but not " Yes"."""
    return AutoTokenizer.from_pretrained(model_path("tiny-llama-localtok"))


async def slot_of(host, words):
    rendered = await host.render_chat([{"role": "user", "content": "Pick one."}])
    return AnswerSlotPlacer(host).place_words(rendered, words)


# --- which words a question has ------------------------------------------------------------------


def test_each_type_has_its_own_words():
    assert word_labels(yes_no()) == ["Yes", "No"]
    assert word_labels(score("Calm", "Angry", "Furious")) == ["1", "2", "3"]
    assert word_labels(choice(billing="Payments", technical=None)) == [
        "billing",
        "technical",
    ]


def test_words_name_their_option_wherever_it_is_listed():
    assert word_labels(reversed_options(yes_no())) == ["No", "Yes"]
    # A reversed scale (debias's second reading) keeps each level's number: 1 is the lowest level.
    assert word_labels(reversed_options(score("Calm", "Angry", "Furious"))) == [
        "3",
        "2",
        "1",
    ]


@pytest.mark.parametrize(
    "question",
    [
        score(*(f"level {i}" for i in range(10))),  # more levels than digits
        CompiledQuestion(
            CHOICE, "Flag?", choice_options([(True, "yes it is"), ("true", None)])
        ),  # two "true"
        CompiledQuestion(
            CHOICE, "Which?", choice_options([("", None), ("x", None)])
        ),  # an empty value
        choice(**{" billing": None, "sales": None}),  # a value with a space around it
    ],
    ids=["ten-levels", "same-word-twice", "empty", "padded"],
)
def test_questions_without_usable_words_have_none(question):
    assert word_labels(question) is None


# --- the answer slot on real tokenizers ----------------------------------------------------------


async def test_yes_and_no_are_single_tokens_after_the_cue_on_smollm2(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    slot = await slot_of(host, ["Yes", "No"])
    assert slot is not None and host.decode(slot.prompt_ids).endswith(ANSWER_CUE)
    assert slot.label_ids == [
        host.encode(f"{ANSWER_CUE} {w}")[-1] for w in ("Yes", "No")
    ]
    for word, token in zip(["Yes", "No"], slot.label_ids, strict=True):
        assert host.encode(
            host.decode(slot.prompt_ids) + " " + word
        ) == slot.prompt_ids + [token]
        assert host.decode([token]) == f" {word}"


async def test_digits_are_read_after_the_cues_space_on_smollm2(smollm2_tokenizer):
    """SmolLM2 (like Qwen and Llama 3) keeps a digit apart from the space before it: " 1" is two tokens.
    The prompt then ends with the space, and each digit is the one token after it."""
    host = TokenizerHost(smollm2_tokenizer)
    assert len(host.encode(f"{ANSWER_CUE} 1")) == len(host.encode(ANSWER_CUE)) + 2
    slot = await slot_of(host, DIGITS)
    assert slot is not None
    prompt = host.decode(slot.prompt_ids)
    assert prompt.endswith(f"{ANSWER_CUE} ")
    assert len(set(slot.label_ids)) == 9
    for digit, token in zip(DIGITS, slot.label_ids, strict=True):
        assert host.encode(prompt + digit) == slot.prompt_ids + [token]
        assert host.decode([token]) == digit


async def test_on_a_tokenizer_that_keeps_the_space_digits_follow_the_cue(
    local_tokenizer,
):
    host = TokenizerHost(local_tokenizer)
    slot = await slot_of(host, DIGITS)
    assert slot is not None and host.decode(slot.prompt_ids).endswith(ANSWER_CUE)
    assert await slot_of(host, ["Yes", "No"]) is None  # " Yes" is two tokens there


async def test_words_that_are_not_single_tokens_have_no_slot(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    assert await slot_of(host, ["billing", "technical", "sales"]) is not None
    assert await slot_of(host, ["billing", "customer success"]) is None
    assert await slot_of(host, ["billing", "Xylophonic"]) is None


async def test_a_blank_label_is_refused(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    rendered = await host.render_chat([{"role": "user", "content": "Pick one."}])
    with pytest.raises(DecisionError, match="blank"):
        AnswerSlotPlacer(host).place(rendered, ["A", ""])


# --- the option lines and the answer instruction ------------------------------------------------


@pytest.mark.parametrize(
    ("question", "lines", "instruction"),
    [
        (
            score("Calm", "Angry", "Furious"),
            ["1. Calm", "2. Angry", "3. Furious"],
            "Answer with one number (1-3).",
        ),
        (
            reversed_options(score("Calm", "Angry")),
            ["2. Angry", "1. Calm"],
            "Answer with one number (1-2).",
        ),
        (
            choice(billing="Payments, refunds", technical="Bugs", sales=None),
            ["- billing: Payments, refunds", "- technical: Bugs", "- sales"],
            "Answer with one of: billing, technical, sales.",
        ),
    ],
    ids=["score", "reversed-score", "choice"],
)
def test_option_lines_and_instruction_in_words(question, lines, instruction):
    text = question_text(question, word_labels(question), words=True)
    head, options, answer = text.split("\n\n")
    assert head == f"Question: {question.instructions}"
    assert options.splitlines() == ["Options:", *lines]
    assert answer == instruction


@pytest.mark.parametrize(
    ("question", "lines"),
    [
        (
            yes_no("time-sensitive", "Can wait"),
            ["Yes: time-sensitive.", "No: Can wait."],
        ),
        (
            reversed_options(yes_no("Late!", "On time.")),
            ["No: On time.", "Yes: Late!"],
        ),
        (yes_no("time-sensitive"), ["Yes: time-sensitive."]),
        (yes_no(), []),
    ],
    ids=["both", "reversed", "one-criterion", "none"],
)
def test_a_yes_no_question_in_words_says_what_each_answer_means(question, lines):
    """No options list and no answer instruction: its frame's instructions ask for Yes or No."""
    text = question_text(question, word_labels(question), words=True)
    assert text.splitlines() == [f"Question: {question.instructions}", *lines]


def test_letters_are_listed_as_before():
    question = choice(billing="Payments", tech=None)
    assert question_text(question, ["A", "B"]).endswith(
        "Options:\nA. billing: Payments\nB. tech\n\nAnswer with one letter (A-B)."
    )


def test_both_layouts_share_the_system_prompt_and_the_state():
    question = choice(billing="Payments", technical=None)
    letters = messages("The state.", question, ["A", "B"])
    words = messages("The state.", question, ["billing", "technical"], words=True)
    assert letters[0] == words[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert "letter" not in SYSTEM_PROMPT
    head = "Document:\nThe state.\n\nQuestion: Which team?\n\nOptions:\n"
    assert letters[1]["content"].startswith(head) and words[1]["content"].startswith(
        head
    )


def test_a_yes_no_question_in_words_has_a_frame_of_its_own():
    """Asked in words, a yes/no question's instructions ask for Yes or No and the state is ``Text``;
    in letters it is framed as every other question."""
    question = yes_no("time-sensitive")
    words = messages("The state.", question, ["Yes", "No"], words=True)
    letters = messages("The state.", question, ["A", "B"])
    assert words[0] == {"role": "system", "content": YES_NO_SYSTEM_PROMPT}
    assert words[1]["content"].startswith("Text:\nThe state.\n\nQuestion: ")
    assert letters[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert letters[1]["content"].startswith("Document:\nThe state.\n\nQuestion: ")


# --- reads ----------------------------------------------------------------------------------------


async def read(tokenizer, question, options=WORDS, **host_args):
    host = TokenizerHost(tokenizer, **host_args)
    reading = await LogitBackend(host, options).read(
        question, ReadContext.about("Card charged twice!", "r")
    )
    (prompt_ids, label_ids), *_ = host.reads
    return (
        reading,
        host.decode(prompt_ids),
        [host.decode([t]).strip() for t in label_ids],
    )


async def test_a_yes_no_question_reads_yes_and_no(smollm2_tokenizer):
    reading, prompt, labels = await read(smollm2_tokenizer, yes_no())
    assert reading.audit.label_layout == "words" and labels == ["Yes", "No"]
    assert prompt.endswith(
        f"Text:\nCard charged twice!\n\nQuestion: Is this urgent?<|im_end|>\n<|im_start|>assistant\n{ANSWER_CUE}"
    )
    assert f"system\n{YES_NO_SYSTEM_PROMPT}<|im_end|>" in prompt


async def test_a_score_reads_its_level_numbers(smollm2_tokenizer):
    reading, prompt, labels = await read(
        smollm2_tokenizer, score("Calm", "Angry", "Furious")
    )
    assert reading.audit.label_layout == "words" and labels == ["1", "2", "3"]
    assert "1. Calm\n2. Angry\n3. Furious\n\nAnswer with one number (1-3)." in prompt
    assert prompt.endswith(f"{ANSWER_CUE} ")


async def test_a_choice_of_single_token_values_reads_them(smollm2_tokenizer):
    reading, prompt, labels = await read(
        smollm2_tokenizer, choice(billing="Payments", technical=None, sales=None)
    )
    assert reading.audit.label_layout == "words" and labels == [
        "billing",
        "technical",
        "sales",
    ]
    assert (
        "- billing: Payments\n- technical\n- sales\n\nAnswer with one of: billing, technical, sales."
        in prompt
    )


async def test_a_choice_with_a_multi_token_value_falls_back_to_letters(
    smollm2_tokenizer,
):
    reading, prompt, labels = await read(
        smollm2_tokenizer, choice(billing="Payments", **{"customer success": None})
    )
    assert reading.audit.label_layout == "markers" and labels == ["A", "B"]
    assert (
        "A. billing: Payments\nB. customer success\n\nAnswer with one letter (A-B)."
        in prompt
    )


async def test_a_yes_no_question_falls_back_where_yes_is_two_tokens(local_tokenizer):
    reading, prompt, labels = await read(local_tokenizer, yes_no())
    assert reading.audit.label_layout == "markers" and labels == ["A", "B"]


async def test_letters_stay_the_default(smollm2_tokenizer):
    reading, prompt, labels = await read(
        smollm2_tokenizer, yes_no(), LogitOptions(logprobs="exact")
    )
    assert reading.audit.label_layout == "markers" and labels == ["A", "B"]
    assert "A. Yes\nB. No\n\nAnswer with one letter (A-B)." in prompt


async def test_word_scores_are_the_words_log_probabilities(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    yes, no = (host.encode(f"{ANSWER_CUE} {w}")[-1] for w in ("Yes", "No"))
    host.logprob = lambda prompt, token: {yes: math.log(0.7), no: math.log(0.2)}.get(
        token, -20.0
    )
    reading = await LogitBackend(host, WORDS).read(
        yes_no(), ReadContext.about("s", "r")
    )
    assert reading.scores == pytest.approx([math.log(0.7), math.log(0.2)])
    assert reading.option_mass == pytest.approx(0.9)


async def test_top_k_reads_of_words(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer, max_logprobs=5)
    yes = host.encode(f"{ANSWER_CUE} Yes")[-1]
    host.logprob = lambda prompt, token: -0.1 if token == yes else -3.0 - token / 1e5
    reading = await LogitBackend(host, LogitOptions(labels="words")).read(
        yes_no(), ReadContext.about("s", "r")
    )
    assert reading.audit.label_layout == "words" and reading.meta.floored == ["No"]


async def test_wide_direct_and_two_stage_keep_letters(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    backend = LogitBackend(
        host,
        LogitOptions(
            labels="words", logprobs="exact", readout="two-stage", shortlist=2
        ),
    )
    reading = await backend.read(
        choice(billing=None, technical=None, sales=None), ReadContext.about("s", "r")
    )
    assert reading.audit.label_layout == "markers"
    assert all("A. " in host.decode(prompt) for prompt, _ in host.reads)


async def test_debias_rotations_keep_each_options_word(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    backend = LogitBackend(host, WORDS)
    question = choice(billing=None, technical=None, sales=None)
    first = await backend.read(question, ReadContext.about("s", "r1"))
    rotated = CompiledQuestion(
        question.qtype,
        question.instructions,
        question.options[1:] + question.options[:1],
    )
    second = await backend.read(rotated, ReadContext.about("s", "r2"))
    (_, ids1), (_, ids2) = host.reads
    assert ids2 == ids1[1:] + ids1[:1]
    assert second.scores == first.scores[1:] + first.scores[:1]


# --- options and the startup check ---------------------------------------------------------------


def test_labels_are_a_startup_and_a_request_option(smollm2_tokenizer):
    spec = parse_backend_spec("logit:labels=words")
    assert backend_options(LogitBackend, spec.args).labels == "words"
    backend = LogitBackend(TokenizerHost(smollm2_tokenizer))
    assert backend.options.labels == "letters"
    assert backend.request_options({"labels": "words"}).labels == "words"
    with pytest.raises(DecisionError, match="labels"):
        backend.request_options({"labels": "digits"})


def loving(host, words=(), bonus=6.0):
    """A scripted model that puts most of its next-token mass on single capital letters and ``words``."""
    favourite = {
        host.encode(f"{ANSWER_CUE} {c}")[-1] for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    }
    favourite |= {host.encode(f"{ANSWER_CUE} {w}")[-1] for w in words}
    return lambda prompt, token: (
        -0.5 - (token % 5) / 10 if token in favourite else -bonus - (token % 11) / 10
    )


@pytest.mark.parametrize(
    ("words", "word_reads"),
    [(("Yes", "No", "Berlin", "Paris", "Rome"), True), ((), False)],
    ids=["words-pass", "words-fail"],
)
async def test_the_self_check_measures_words_and_gates_them(
    smollm2_tokenizer, words, word_reads
):
    host = TokenizerHost(smollm2_tokenizer)
    host.logprob = loving(host, words)
    backend = LogitBackend(
        host, LogitOptions(labels="words", logprobs="exact"), Settings.from_env({})
    )
    facts = await backend.start()
    assert facts.option_mass >= 0.5  # letters decide the check
    assert (
        facts.words_option_mass is not None
        and (facts.words_option_mass >= 0.5) is word_reads
    )
    assert backend.runner.word_reads is word_reads
    line = describe_prompt(facts, 0.5)
    assert f"words option mass {facts.words_option_mass:.3f}" in line
    assert ("reads asking for words use letters" in line) is not word_reads
    reading = await backend.read(yes_no(), ReadContext.about("s", "r"))
    assert reading.audit.label_layout == ("words" if word_reads else "markers")


async def test_without_any_probe_in_words_reads_use_letters(local_tokenizer):
    host = TokenizerHost(local_tokenizer)
    host.logprob = loving(host)
    backend = LogitBackend(
        host, LogitOptions(labels="words", logprobs="exact"), Settings.from_env({})
    )
    facts = await backend.start()
    assert facts.words_option_mass is None and backend.runner.word_reads is False
    assert "none of the probes' words are single tokens" in describe_prompt(facts, 0.5)
    # " 1" is one token here, but unchecked
    reading = await backend.read(score("low", "high"), ReadContext.about("s", "r"))
    assert reading.audit.label_layout == "markers"
