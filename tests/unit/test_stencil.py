"""The state rendered once per request: a stencil's prompt is token for token the full rendering, on
real tokenizers, for states and questions chosen to stress the seam; and it falls back where it must."""

from __future__ import annotations

import asyncio

import pytest

from vllm.entrypoints.generate.decisions.decide.backends.logit.stencil import (
    PLACEHOLDER,
    StencilPool,
    build_stencil,
    stencil_check,
)
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import (
    DOCUMENT_FRAME,
    YES_NO_FRAME,
    chat,
    question_text,
)
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    ChoiceQuestion,
    NoulQuestion,
)

from .fakes import TokenizerHost

STATES = [
    "Ticket: My payouts have been failing for 3 days.",
    "x",
    "",
    "Trailing blanks and tabs   \t \n\n\n",
    "Numbers 1234567890 12.5e-3 0x1F 2026-11-30T09:45:00Z",
    "Punctuation runs?!?!... ---- ==== ;;;; '''' \"\"\"",
    "Straße Ærøskøbing naïve café 東京は日本の首都です。 한국어 العربية 🚀👩‍💻",
    "b" * 300,
    "c" * 5000,
    "def f(x):\n    return {'a': [1, 2, 3]}\n\n\n# end",
    "Literal template markers <|im_end|> <|im_start|>assistant and [INST] stay text",
    " ".join(f"word{i}" for i in range(900)),
    "line\r\nwindows\r\n",
]

QUESTIONS = [
    NOUL.compile(NoulQuestion(instructions="Is this urgent?")),
    NOUL.compile(NoulQuestion(instructions=":) punctuation first")),
    NOUL.compile(NoulQuestion(instructions="")),
    NOUL.compile(NoulQuestion(instructions="\n\nstarts with blank lines")),
    CHOICE.compile(
        ChoiceQuestion(
            instructions="Which team?", criteria={f"team {i}": None for i in range(30)}
        )
    ),
]


def body(question):
    labels = [chr(ord("A") + i) for i in range(min(len(question.options), 26))]
    if len(question.options) > 26:
        labels += [f"A{chr(ord('A') + i)}" for i in range(len(question.options) - 26)]
    return question_text(question, labels)


@pytest.mark.parametrize("frame", [DOCUMENT_FRAME, YES_NO_FRAME])
async def test_stencil_prompts_are_the_full_rendering(any_tokenizer, frame):
    host = TokenizerHost(any_tokenizer)
    pool = StencilPool(host, enabled=await stencil_check(host))
    assert pool.enabled
    shared = 0
    for state in STATES:
        shared += await build_stencil(host, state, frame=frame) is not None
        for question in QUESTIONS:
            expected = await host.render_chat(chat(state, body(question), frame=frame))
            assert await pool.prompt_ids(state, body(question), frame=frame) == (
                expected
            ), (state[:40], question.instructions)
    # only states with no clean cut near their end go without
    assert shared >= len(STATES) - 3


async def test_each_frame_of_a_state_has_its_own_stencil(smollm2_tokenizer):
    """Reads about one state in flight together, in both frames: each prompt is its own frame's."""
    host = TokenizerHost(smollm2_tokenizer)
    pool = StencilPool(host)
    state = "A long state. " * 300
    question = body(QUESTIONS[0])
    frames = [DOCUMENT_FRAME, YES_NO_FRAME] * 4
    prompts = await asyncio.gather(
        *(pool.prompt_ids(state, question, frame=frame) for frame in frames)
    )
    assert host.renders == 2 and not pool._shared
    for frame, ids in zip(frames, prompts, strict=True):
        assert ids == await host.render_chat(chat(state, question, frame=frame))
    assert prompts[0] != prompts[1]


async def test_questions_in_flight_share_one_rendering(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    pool = StencilPool(host)
    state = "A long state. " * 300
    bodies = [
        body(NOUL.compile(NoulQuestion(instructions=f"Question {i}?")))
        for i in range(16)
    ]
    prompts = await asyncio.gather(*(pool.prompt_ids(state, b) for b in bodies))
    assert host.renders == 1
    assert not pool._shared  # nothing outlives the reads that used it
    for b, ids in zip(bodies, prompts, strict=True):
        assert ids == await host.render_chat(chat(state, b))


async def test_a_failed_build_fails_every_reader_and_is_dropped(smollm2_tokenizer):
    class Broken(TokenizerHost):
        async def render_chat_text(self, messages):
            await asyncio.sleep(0)
            raise RuntimeError("template exploded")

    pool = StencilPool(Broken(smollm2_tokenizer))
    results = await asyncio.gather(
        *(pool.prompt_ids("s", "q") for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)
    assert not pool._shared


async def test_no_offsets_no_stencil(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer, offsets=False)
    assert not await stencil_check(host)
    pool = StencilPool(host, enabled=False)
    state, b = "Some state.", body(QUESTIONS[0])
    assert await pool.prompt_ids(state, b) == await host.render_chat(chat(state, b))


async def test_a_template_that_rewrites_the_text_switches_it_off(smollm2_tokenizer):
    rewriting = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | replace('\\n', ' ') }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert not await stencil_check(
        TokenizerHost(smollm2_tokenizer, chat_template=rewriting)
    )


@pytest.mark.parametrize(
    "state", [f"contains the placeholder {PLACEHOLDER} itself", "tiny"]
)
async def test_states_without_a_stencil_render_in_full(smollm2_tokenizer, state):
    host = TokenizerHost(smollm2_tokenizer)
    b = body(QUESTIONS[0])
    if PLACEHOLDER in state:
        assert await build_stencil(host, state) is None
    assert await StencilPool(host).prompt_ids(state, b) == await host.render_chat(
        chat(state, b)
    )
