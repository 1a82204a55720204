"""Checks run inside a vLLM tree patched with patches/00572 (the test puts it first on PYTHONPATH): the
canvas-read arguments and their errors, the read maths, and the sampler's denoise step with a canvas
read, on CPU. Prints ``ok NAME`` per check; any failure raises. The engine path itself needs a GPU."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams
from vllm.v1.sample import canvas_read

DIFFUSION, OTHER = (
    SimpleNamespace(is_diffusion=True),
    SimpleNamespace(is_diffusion=False),
)
READ = {"canvas": [7, 3], "slots": [0], "max_steps": 2}


def refused(params: SamplingParams, model: SimpleNamespace, message: str) -> None:
    try:
        params._validate_diffusion(model)
    except VLLMValidationError as exc:
        assert message in str(exc), (message, str(exc))
        return
    raise AssertionError(f"not refused: {message}")


def read_params(**overrides) -> SamplingParams:
    args = {
        "max_tokens": 1,
        "logprob_token_ids": [4, 5],
        "extra_args": {"canvas_read": READ},
        **overrides,
    }
    return SamplingParams(**args)


def arguments() -> None:
    read_params()._validate_diffusion(DIFFUSION)
    assert canvas_read.parse_canvas_read(
        {"canvas_read": READ}
    ) == canvas_read.CanvasRead((7, 3), (0,), 2)
    assert (
        canvas_read.parse_canvas_read({"canvas_read": {"canvas": [1]}}).max_steps == 1
    )
    refused(read_params(), OTHER, "canvas_read needs a diffusion model")
    refused(read_params(max_tokens=2), DIFFUSION, "max_tokens=1 and n=1")
    refused(
        read_params(logprobs=3),
        DIFFUSION,
        "names the tokens it reads in logprob_token_ids",
    )
    refused(
        read_params(logprob_token_ids=None),
        DIFFUSION,
        "names the tokens it reads in logprob_token_ids",
    )
    refused(
        read_params(temperature=0.0),
        DIFFUSION,
        "not yet supported with diffusion models",
    )
    for bad, message in [
        ({"canvas": []}, "at least one token"),
        ({"canvas": [1, "2"]}, "list of integers"),
        ({"canvas": [1, 2], "slots": [2]}, "positions in the canvas"),
        ({"canvas": [1, 2], "slots": [0, 0]}, "distinct positions"),
        ({"canvas": [1], "max_steps": 0}, "max_steps must be an integer >= 1"),
        ({"canvas": [1], "width": 3}, "unknown fields ['width']"),
        ([1, 2], "must be an object"),
    ]:
        refused(read_params(extra_args={"canvas_read": bad}), DIFFUSION, message)
    # no read, not diffusion: untouched
    SamplingParams(max_tokens=5)._validate_diffusion(OTHER)
    print("ok arguments")


def limits() -> None:
    read = canvas_read.parse_canvas_read({"canvas_read": READ})
    canvas_read.check_limits(
        read, canvas_length=2, vocab_size=8, max_denoising_steps=None
    )
    for kwargs, message in [
        (
            {"canvas_length": 1, "vocab_size": 8, "max_denoising_steps": None},
            "canvas holds 1",
        ),
        (
            {"canvas_length": 4, "vocab_size": 7, "max_denoising_steps": None},
            "outside [0, 7)",
        ),
        (
            {"canvas_length": 4, "vocab_size": 8, "max_denoising_steps": 1},
            "denoises at most 1 steps",
        ),
    ]:
        try:
            canvas_read.check_limits(read, **kwargs)
        except ValueError as exc:
            assert message in str(exc), (message, str(exc))
        else:
            raise AssertionError(message)
    assert (
        canvas_read.canvas_width(read_params()) == 2
        and canvas_read.canvas_width(SamplingParams()) is None
    )
    print("ok limits")


def read_maths() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5], [0.0, 0.0, 4.0, 0.0]])
    ids, logprobs = canvas_read.read_rows(logits, [0, 2])
    expected = logits.log_softmax(-1)
    assert ids.tolist() == [[1, 0, 2], [2, 0, 2]]
    assert torch.allclose(logprobs, expected.gather(1, ids))
    wide, wide_lp = canvas_read.stack_rows(
        [ids, torch.tensor([[3, 1]])], [logprobs, torch.tensor([[-0.1, -2.0]])]
    )
    assert (
        wide.tolist()[-1] == [3, 1, 0]
        and math.isinf(float(wide_lp[-1, -1]))
        and wide_lp.shape == (3, 3)
    )
    print("ok read_maths")


def denoise_step() -> None:
    """One denoise step of the sampler with a canvas read in slot 0 and a plain request in slot 1: the
    read keeps its pinned token and converges at its step cap; the plain request does neither."""
    from vllm.model_executor.models.diffusion_gemma import (
        DiffusionGemmaRequestStates,
        _compiled_sample_step,
    )

    CL, vocab, hidden = 4, 16, 8
    states = DiffusionGemmaRequestStates(
        2, CL, vocab, 48, torch.device("cpu"), hidden, 1
    )
    states.set_canvas_read(0, canvas_read.CanvasRead((9, 11), (0,), 1))
    states.set_canvas_read(1, None)
    slots = torch.tensor([0, 1])
    states.init_canvas(slots)
    states.seed_canvas_reads(slots)
    assert states.canvas[0, :2].tolist() == [9, 11] and int(states.step_cap[1]) == 48
    states.is_encoder_phase[:] = False  # both denoise this step
    draft = torch.zeros(2, CL, dtype=torch.int64)
    sampled, num_sampled = (
        torch.zeros(2, CL, dtype=torch.int32),
        torch.zeros(2, dtype=torch.int32),
    )

    def denoise(logits: torch.Tensor) -> None:  # one step for both slots
        _compiled_sample_step(
            logits,
            slots,
            slots,
            slots,
            torch.tensor([2, CL]),
            states.canvas,
            states.argmax_canvas,
            states.step,
            states.is_encoder_phase,
            states.confident,
            states.self_conditioning_embeds,
            torch.randn(vocab, hidden),
            torch.tensor(1.0),
            states.accepted_canvas_history,
            states.accepted_canvas_history_len,
            sampled,
            num_sampled,
            draft,
            states.step_cap,
            states.read_pinned,
            states.read_template,
            max_denoising_steps=48.0,
            t_min=0.4,
            t_max=0.8,
            confidence_threshold=0.0,
            vocab_size=vocab,
            CL=CL,
            ST=1,
            entropy_bound=0.1,
            sc_vocab_start=0,
            sc_vocab_end=vocab,
            tp_size=1,
            tp_group_name="",
        )

    denoise(torch.randn(2 * CL, vocab))
    assert states.is_encoder_phase.tolist() == [
        True,
        False,
    ]  # the read converged at max_steps=1, commits next
    # converged canvas = argmax canvas
    assert int(states.argmax_canvas[0, 1]) == int(states.canvas[0, 1])
    states.set_canvas_read(0, canvas_read.CanvasRead((9, 11), (0,), 5))
    states.is_encoder_phase[:] = False
    states.step[:] = 0
    states.canvas[0, :2] = torch.tensor([9, 11])
    certain = torch.zeros(2 * CL, vocab)
    certain[:, 0] = 50.0  # every position accepts token 0, unless pinned
    denoise(certain)
    assert not bool(states.is_encoder_phase[0])  # max_steps=5: still denoising
    assert states.canvas[0, :2].tolist() == [0, 11] and draft[0, :2].tolist() == [
        0,
        11,
    ]  # the slot moved, the pin held
    assert states.canvas[1].tolist() == [0] * CL
    print("ok denoise_step")


if __name__ == "__main__":
    arguments()
    limits()
    read_maths()
    denoise_step()
