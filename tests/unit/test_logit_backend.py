"""The logit backend's prompt, answer slot, readouts and logprob modes, on real tokenizers with
scripted log-probabilities (no model runs)."""

from __future__ import annotations

import math

import pytest

from vllm.entrypoints.generate.decisions.decide.backends.logit import LogitBackend
from vllm.entrypoints.generate.decisions.decide.backends.logit.options import (
    LogitOptions,
)
from vllm.entrypoints.generate.decisions.decide.backends.logit.readouts import plan
from vllm.entrypoints.generate.decisions.decide.backends.logit.reads import ReadFacts
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import (
    ANSWER_CUE,
    AnswerSlotPlacer,
    supported_reasoning_blocks,
)
from vllm.entrypoints.generate.decisions.decide.prompting.labels import LabelCatalog
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    ChoiceQuestion,
    NoulQuestion,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.settings import Settings, SettingsError

from .fakes import TokenizerHost


def letters(n):
    return [chr(ord("A") + i) for i in range(n)]


def choice(n, instructions="Which?"):
    return CHOICE.compile(
        ChoiceQuestion(
            instructions=instructions, criteria={f"option {i}": None for i in range(n)}
        )
    )


def letter_loving(host, bonus=6.0):
    """A scripted model that puts most of its next-token mass on single capital letters."""
    letter_ids = {host.encode(f" {c}")[-1] for c in letters(26)}
    return lambda prompt, token: (
        -0.5 - (token % 5) / 10 if token in letter_ids else -bonus - (token % 11) / 10
    )


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


@pytest.mark.parametrize(
    ("template_end", "expected_end"),
    [
        ("<|im_start|>assistant\n<think>", "<think></think>Answer:"),
        ("<|start|>assistant", "<|start|>assistant<|channel|>final<|message|>Answer:"),
        ("<|im_start|>assistant\n{{ '' }}", "assistant\nAnswer:"),
    ],
)
async def test_open_endings_are_closed(smollm2_tokenizer, template_end, expected_end):
    host = TokenizerHost(smollm2_tokenizer)
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        + template_end
    )
    text = smollm2_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], chat_template=template, tokenize=False
    )
    slot = AnswerSlotPlacer(host).place(host.encode(text), ["A", "B"])
    assert host.decode(slot.prompt_ids).endswith(expected_end)


def test_reasoning_blocks_need_single_special_tokens(smollm2_tokenizer):
    assert supported_reasoning_blocks(TokenizerHost(smollm2_tokenizer)) == []


async def test_direct_read_returns_the_label_log_probabilities(smollm2_tokenizer):
    host = TokenizerHost(
        smollm2_tokenizer, logprob=lambda prompt, token: -float(token % 5) - 0.5
    )
    backend = LogitBackend(host, LogitOptions(logprobs="exact"))
    question = CHOICE.compile(
        ChoiceQuestion(
            instructions="Which?", criteria={"a": "first", "b": None, "c": None}
        )
    )
    reading = await backend.read(question, ReadContext.about("The state.", "r"))
    (prompt_ids, label_ids), *_ = host.reads
    assert reading.scores == [-float(t % 5) - 0.5 for t in label_ids]
    assert reading.option_mass == pytest.approx(
        sum(math.exp(s) for s in reading.scores)
    )
    assert (reading.forward_passes, reading.readout, reading.meta) == (
        1,
        "direct",
        ReadFacts(logprobs="exact"),
    )
    text = host.decode(prompt_ids)
    assert "The state." in text and "A. a: first" in text and "C. c" in text


async def test_top_k_floors_labels_outside_the_window(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer, max_logprobs=5)
    b_id = host.encode(" B")[-1]
    host.logprob = lambda prompt, token: -0.1 if token == b_id else -3.0 - token / 1e5
    reading = await LogitBackend(host).read(choice(3), ReadContext.about("s", "r"))
    assert reading.meta.logprobs == "top-k" and reading.meta.topk_window == 5
    assert reading.meta.floored == ["A", "C"]
    # The 5-wide window holds B and the four next-best tokens (ids 0-3); its lowest value is the floor.
    floor = -3.0 - 3 / 1e5
    assert reading.scores[1] == -0.1 and reading.scores[0] == reading.scores[2] == floor
    # only labels actually read count
    assert reading.option_mass == pytest.approx(math.exp(-0.1))


async def test_incomplete_exact_read_falls_back_and_says_so(smollm2_tokenizer):
    c_id = smollm2_tokenizer.encode(" C", add_special_tokens=False)[-1]
    host = TokenizerHost(smollm2_tokenizer, drop=lambda token: token == c_id)
    reading = await LogitBackend(host, LogitOptions(logprobs="exact")).read(
        choice(3), ReadContext.about("s", "r")
    )
    assert (
        reading.meta.degraded is True
        and "lacked 1 of 3" in reading.meta.degraded_reason
    )
    assert reading.forward_passes == 2 and len(host.top_reads) == 1


async def test_two_stage_exact_reads_have_no_fallback(smollm2_tokenizer):
    b_id = smollm2_tokenizer.encode(" B", add_special_tokens=False)[-1]
    host = TokenizerHost(smollm2_tokenizer, drop=lambda token: token == b_id)
    backend = LogitBackend(host, LogitOptions(logprobs="exact", readout="two-stage"))
    with pytest.raises(DecisionError, match="no fallback"):
        await backend.read(choice(4), ReadContext.about("s", "r"))


async def test_wide_direct_uses_pairs_after_the_markers(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    backend = LogitBackend(host, LogitOptions(logprobs="exact"))
    rendered = await host.render_chat([{"role": "user", "content": "x"}])
    pairs = backend.placer.single_token_labels(rendered, ["AA", "AB", "QZ", "ZZ", "XJ"])
    assert pairs, "SmolLM2 keeps some letter pairs as single tokens"
    backend.catalog = LabelCatalog(backend.catalog.markers, tuple(pairs))
    backend.runner.catalog = backend.catalog
    reading = await backend.read(choice(26 + len(pairs)), ReadContext.about("s", "r"))
    assert (
        reading.readout == "wide-direct"
        and reading.audit.label_layout == "markers+pairs"
    )
    assert (
        host.decode(host.reads[-1][0]).count(f"{pairs[-1]}. option {25 + len(pairs)}")
        == 1
    )


async def test_two_stage_finalists_share_their_stage_one_mass(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    a_id, b_id = (
        smollm2_tokenizer.encode(f" {c}", add_special_tokens=False)[-1] for c in "AB"
    )

    def logprob(prompt, token):
        text = host.decode(prompt)
        # stage 1: options 0-2 look good, the rest bad
        if "Does this option fit" in text:
            good = any(f"fit: option {i}\n" in text for i in range(3))
            return {
                a_id: math.log(0.8 if good else 0.1),
                b_id: math.log(0.2 if good else 0.9),
            }.get(token, -20.0)
        return {a_id: math.log(0.6), b_id: math.log(0.3)}.get(token, math.log(0.1 / 3))

    host.logprob = logprob
    backend = LogitBackend(
        host, LogitOptions(logprobs="exact", readout="two-stage", shortlist=3)
    )
    reading = await backend.read(choice(6), ReadContext.about("s", "r"))
    assert reading.readout == "two-stage" and reading.forward_passes == 7
    assert reading.meta.shortlist == ['"option 0"', '"option 1"', '"option 2"']
    probs = [math.exp(s) for s in reading.scores]
    assert sum(probs) == pytest.approx(1.0)
    first = [0.8] * 3 + [0.1] * 3
    shared = sum(first[:3]) / sum(first)
    final = [p / (0.6 + 0.3 + 0.1 / 3 * 1) for p in (0.6, 0.3, 0.1 / 3)]
    assert probs[:3] == pytest.approx([shared * p for p in final], rel=1e-6)
    assert probs[3:] == pytest.approx([0.1 / sum(first)] * 3, rel=1e-6)


@pytest.mark.parametrize(
    ("count", "options", "pairs", "expected"),
    [
        (5, {}, 0, ("direct", "top-k")),
        (26, {"logprobs": "exact"}, 0, ("direct", "exact")),
        (27, {}, 300, ("wide-direct", "top-k")),
        (100, {"logprobs": "exact"}, 300, ("wide-direct", "exact")),
        (
            200,
            {"logprobs": "exact"},
            300,
            ("wide-direct", "top-k"),
        ),  # past the token-id cap: top-k
        (255, {}, 100, ("two-stage", "top-k")),
        (3, {"readout": "two-stage"}, 0, ("two-stage", "top-k")),
    ],
)
def test_auto_picks_the_first_read_that_fits(count, options, pairs, expected):
    catalog = LabelCatalog(tuple(letters(26)), tuple(f"P{i}" for i in range(pairs)))
    chosen = plan(count, LogitOptions(**options), catalog, token_id_cap=128)
    assert (chosen.readout, chosen.logprobs) == expected


@pytest.mark.parametrize(
    ("count", "options", "needle"),
    [
        (27, {"readout": "direct"}, "at most 26"),
        (400, {"readout": "wide-direct"}, "at most 326"),
        (200, {"readout": "wide-direct", "logprobs": "exact"}, "MAX_LOGPROB_TOKEN_IDS"),
    ],
)
def test_explicit_reads_that_do_not_fit_are_refused(count, options, needle):
    catalog = LabelCatalog(tuple(letters(26)), tuple(f"P{i}" for i in range(300)))
    with pytest.raises(DecisionError, match=needle):
        plan(count, LogitOptions(**options), catalog, token_id_cap=128)


async def test_self_check_refuses_a_model_that_does_not_answer_with_letters(
    smollm2_tokenizer,
):
    host = TokenizerHost(
        smollm2_tokenizer,
        logprob=lambda prompt, token: -math.log(len(smollm2_tokenizer)),
    )
    backend = LogitBackend(host, settings=Settings.from_env({}))
    with pytest.raises(
        RuntimeError, match="not an option letter.*VLLM_TYPED_DECISIONS_MIN_OPTION_MASS"
    ):
        await backend.start()


async def test_self_check_passes_and_finds_pairs(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    host.logprob = letter_loving(host)
    backend = LogitBackend(host, settings=Settings.from_env({}))
    await backend.start()
    assert backend.catalog.wide_capacity > 26
    assert "wide-direct up to" in backend.describe_limits()


def test_more_markers_than_the_top_k_window_refuses_to_start(smollm2_tokenizer):
    with pytest.raises(SettingsError, match="--max-logprobs 20"):
        LogitBackend(
            TokenizerHost(smollm2_tokenizer, max_logprobs=20),
            LogitOptions(markers="ABCDEFGHIJKLMNOPQRSTUV"),
        )


async def test_questions_about_one_state_share_the_state_prefix(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    backend = LogitBackend(host, LogitOptions(logprobs="exact"))
    state = "A long state. " * 50
    await backend.read(
        NOUL.compile(NoulQuestion(instructions="One?")), ReadContext.about(state, "r1")
    )
    await backend.read(
        CHOICE.compile(
            ChoiceQuestion(instructions="Two?", criteria={"x": None, "y": None})
        ),
        ReadContext.about(state, "r2"),
    )
    (first, _), (second, _) = host.reads
    shared = next(
        i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b
    )
    assert state.rstrip() in host.decode(first[:shared])


async def test_a_prompt_longer_than_the_context_is_refused(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer, max_model_len=64)
    with pytest.raises(DecisionError, match="--max-model-len 64"):
        await LogitBackend(host).read(
            NOUL.compile(NoulQuestion(instructions="?")),
            ReadContext.about("word " * 100, "r"),
        )
    assert host.reads == [] and host.top_reads == []


def test_per_request_markers_are_refused_unless_the_servers(smollm2_tokenizer):
    """The label catalog comes from the startup markers: a request's other markers would go unread (and
    only split the content-free prior's cache), so they are refused, naming the option and the setting."""
    backend = LogitBackend(
        TokenizerHost(smollm2_tokenizer), LogitOptions(markers="ABCD")
    )
    with pytest.raises(DecisionError) as refused:
        backend.request_options({"markers": "WXYZ"})
    assert (
        refused.value.status == 400
        and refused.value.param == "extra.backend_options.markers"
    )
    assert (
        "set at startup only (VLLM_TYPED_DECISIONS_BACKEND=logit:markers=...)"
        in refused.value.message
    )
    assert (
        backend.request_options({"markers": "ABCD", "readout": "direct"}).readout
        == "direct"
    )
    assert backend.request_options({"readout": "direct"}).markers == "ABCD"
