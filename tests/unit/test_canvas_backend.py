"""The canvas backend against a host that does the canvas read with transformers' DiffusionGemma on the
tiny checkpoint: the prompt, the seeded canvases, averaging, standard errors, agreement and refusals."""

from __future__ import annotations

import asyncio
import math

import pytest

from tests.unit.asking import ask
from vllm.entrypoints.generate.decisions.decide.backends import CanvasBackend
from vllm.entrypoints.generate.decisions.decide.backends.base import facts_json
from vllm.entrypoints.generate.decisions.decide.backends.canvas.backend import (
    CanvasOptions,
    average,
    noise_tokens,
)
from vllm.entrypoints.generate.decisions.decide.backends.registry import choose_backend
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import (
    AnswerSlotPlacer,
)
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import messages
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    ChoiceQuestion,
    NoulQuestion,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.scoring import softmax
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import BackendSpec, Settings
from vllm.entrypoints.generate.decisions.decide.vllm_versions import (
    BUILT_IN_CANVAS_READ,
)

from ..canvas_reference import DiffusionGemmaHost
from ..conftest import model_path

STATE = "Ticket: my payouts have failed for three days."
QUESTION = NOUL.compile(NoulQuestion(instructions="Is this urgent?"))


@pytest.fixture(scope="module")
def host() -> DiffusionGemmaHost:
    return DiffusionGemmaHost(model_path("tiny-diffusiongemma"))


def started(host, **options) -> CanvasBackend:
    backend = CanvasBackend(host, CanvasOptions(**options))
    asyncio.run(backend.start())
    return backend


def read(backend, question=QUESTION, **options):
    return asyncio.run(
        backend.read(
            question,
            ReadContext.about(STATE, "r", backend.options.model_copy(update=options)),
        )
    )


def test_chosen_for_diffusiongemma_by_itself():
    assert (
        choose_backend(BackendSpec(None, {}), ("DiffusionGemmaForBlockDiffusion",))
        is CanvasBackend
    )


def test_one_read_is_the_logit_prompt_then_noise_and_the_turn_close(host):
    backend = started(host, seed=11)
    assert backend.turn_close == host.tokenizer.convert_tokens_to_ids("<turn|>")
    reading = read(backend)
    prompt, canvas, label_ids, steps = host.canvas_calls[-1]
    slot = AnswerSlotPlacer(host).place(
        asyncio.run(host.render_chat(messages(STATE, QUESTION, ["A", "B"]))), ["A", "B"]
    )
    assert (prompt, label_ids, steps) == (slot.prompt_ids, slot.label_ids, 1)
    assert canvas == [noise_tokens(11, 1, host.vocab_size)[0], backend.turn_close]
    direct = asyncio.run(host.read_canvas(prompt, canvas, label_ids, 1, "again"))
    expected = softmax([direct.logprobs[t] for t in label_ids])
    assert [math.exp(s) for s in reading.scores] == pytest.approx(expected, abs=1e-9)
    assert facts_json(reading.meta) == {
        "seed": 11,
        "samples": {"n": 1, "stderr": {"true": 0.0, "false": 0.0}, "agreement": 1.0},
        "canvas_width": 2,
        "max_steps": 1,
    }
    assert (
        reading.readout == "direct"
        and reading.forward_passes == 1
        and 0 < reading.option_mass < 1
    )


def test_samples_average_noise_draws_from_one_seed(host):
    backend = started(host, samples=5, seed=7)
    question = CHOICE.compile(
        ChoiceQuestion(
            instructions="Which team?",
            criteria={"billing": None, "tech": None, "sales": None},
        )
    )
    reading = read(backend, question)
    calls = host.canvas_calls[-5:]
    assert [c[1][0] for c in calls] == noise_tokens(7, 5, host.vocab_size)
    assert len({c[1][0] for c in calls}) > 1  # the draws differ, so the reads do
    per_read = [
        softmax(
            [
                asyncio.run(host.read_canvas(c[0], c[1], c[2], 1, "x")).logprobs[t]
                for t in c[2]
            ]
        )
        for c in calls
    ]
    mean = [sum(col) / 5 for col in zip(*per_read, strict=True)]
    assert [math.exp(s) for s in reading.scores] == pytest.approx(mean, abs=1e-9)
    stderr = reading.meta.samples.stderr
    for key, column, m in zip(
        ('"billing"', '"tech"', '"sales"'),
        zip(*per_read, strict=True),
        mean,
        strict=True,
    ):
        assert stderr[key] == pytest.approx(
            math.sqrt(sum((p - m) ** 2 for p in column) / 4 / 5)
        )
    top = max(range(3), key=lambda i: mean[i])
    assert (
        reading.meta.samples.agreement
        == sum(max(range(3), key=lambda i: p[i]) == top for p in per_read) / 5
    )
    # reads after the first hit the cache
    assert reading.forward_passes == 5 and reading.cached_input_tokens > 0
    # the same seed, the same canvases
    assert read(backend, question).scores == reading.scores


def test_extra_seed_reaches_the_reads_and_no_seed_draws_one(host):
    backend = started(host)
    service = DecisionService(Settings.from_env({}), backend, "tiny")
    service.readiness.succeed()
    answer = asyncio.run(service.decide(ask(STATE, [QUESTION], "r", seed=42))).results[
        0
    ]
    assert (
        answer.backend.facts["seed"] == 42
        and host.canvas_calls[-1][1][0] == noise_tokens(42, 1, host.vocab_size)[0]
    )
    drawn = read(backend).meta.seed
    assert isinstance(drawn, int) and 0 <= drawn < 2**63


def test_max_steps_goes_to_the_engine(host):
    with pytest.raises(DecisionError, match="one denoising step only"):
        read(started(host), max_steps=3)
    assert host.canvas_calls[-1][3] == 3


def test_refused_before_any_read(host):
    backend = started(host)
    before = len(host.canvas_calls)
    many = CHOICE.compile(ChoiceQuestion(criteria={f"c{i}": None for i in range(27)}))
    with pytest.raises(
        DecisionError, match="27 options; the canvas backend reads directly, at most 26"
    ):
        read(backend, many)
    short = DiffusionGemmaHost(model_path("tiny-diffusiongemma"), max_model_len=40)
    with pytest.raises(
        DecisionError,
        match=r"and its canvas 2; the model's context \(--max-model-len 40\)",
    ):
        read(started(short))
    assert len(host.canvas_calls) == before and short.canvas_calls == []


def test_startup_needs_the_patch_and_a_turn_close_marker(host):
    no_patch = DiffusionGemmaHost.__new__(DiffusionGemmaHost)
    no_patch.__dict__.update(host.__dict__, canvas_reads=False)
    # vLLM 0.32 reads canvases itself: there, only a diffusion model is missing.
    with pytest.raises(
        RuntimeError,
        match="needs a diffusion model" if BUILT_IN_CANVAS_READ else "patches/00572",
    ):
        started(no_patch)
    plain = DiffusionGemmaHost.__new__(DiffusionGemmaHost)
    plain.__dict__.update(
        host.__dict__,
        chat_template="{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
    )
    with pytest.raises(RuntimeError, match="no special token"):
        started(plain)


def test_average_maths():
    together = average([[0.75, 0.25], [0.25, 0.75], [0.5, 0.5], [0.5, 0.5]])
    # a tie goes to the first
    assert together.probabilities == [0.5, 0.5] and together.agreement == 0.75
    assert together.stderr == pytest.approx([math.sqrt((0.0625 * 2) / 3 / 4)] * 2)
    assert average([[0.2, 0.8]]).stderr == [0.0, 0.0]
    assert noise_tokens(3, 4, 100) == noise_tokens(3, 4, 100) != noise_tokens(4, 4, 100)
