"""vLLM 0.32's own checks on the canvas read VllmHost sends there (``host.canvas_read_args``): the diffusion
argument validation its input processor runs at admission (vllm/utils/diffusion.py) and SamplingParams'
diffusion check accept the read unchanged, and refuse the malformed reads patches/00572 refuses on 0.30.

Needs vLLM 0.32: ``.venv-0.32/bin/python -m pytest tests/unit/test_canvas_read_v032.py``; elsewhere it skips.
The engine path itself does not run here: vLLM 0.32's CPU build can't load DiffusionGemma (docs/canvas.md)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import vllm

pytestmark = pytest.mark.vllm032
if not vllm.__version__.startswith("0.32."):
    pytest.skip(
        f"needs vLLM 0.32 (.venv-0.32); this is {vllm.__version__}",
        allow_module_level=True,
    )

from vllm.entrypoints.generate.decisions.decide.engine.requests import canvas_read_args  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.diffusion import validate_diffusion_sampling_params  # noqa: E402

from ..conftest import model_path  # noqa: E402

LABELS = [235, 236]
SERVED_CANVAS = 32  # --diffusion-config '{"canvas_length": 32}'


@pytest.fixture(scope="module")
def tiny() -> SimpleNamespace:
    """The tiny DiffusionGemma's vocabulary size and turn-close token: a canvas the backend would send."""
    from transformers import AutoTokenizer

    folder = model_path("tiny-diffusiongemma")
    vocab = json.loads((folder / "config.json").read_text())["text_config"][
        "vocab_size"
    ]
    turn_close = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<turn|>")
    return SimpleNamespace(vocab=vocab, turn_close=turn_close)


def admitted(
    args: dict, vocab: int, canvas_length: int | None = SERVED_CANVAS
) -> SamplingParams:
    """``args`` as vLLM 0.32 admits a request: SamplingParams' diffusion check, then the input processor's."""
    params = SamplingParams(**args)
    params._validate_diffusion(SimpleNamespace(is_diffusion=True))  # type: ignore[arg-type]
    validate_diffusion_sampling_params(
        params, canvas_length=canvas_length, vocab_size=vocab
    )
    return params


# None: served without --diffusion-config
@pytest.mark.parametrize("canvas_length", [SERVED_CANVAS, None])
@pytest.mark.parametrize("max_steps", [1, 3])
def test_the_hosts_read_is_admitted_as_a_read_only_one_canvas_read(
    tiny, canvas_length, max_steps
):
    canvas = [tiny.vocab - 1, tiny.turn_close]
    params = admitted(
        canvas_read_args(canvas, LABELS, max_steps), tiny.vocab, canvas_length
    )
    assert params.extra_args == {
        "diffusion_seed_canvas": canvas,
        "diffusion_canvas_length": 2,
        "diffusion_pinned": [
            1
        ],  # the turn-close marker is held; only the answer slot may change
        "diffusion_max_steps": max_steps,
        "diffusion_read_only": True,
    }
    # Admission leaves the read as sent: one canvas is the whole output, and a turn-close drawn into the
    # output does not end it early.
    assert params.max_tokens == 2 and params.ignore_eos
    assert list(params.logprob_token_ids or []) == LABELS and params.logprobs is None
    assert params.temperature == 1.0 and params.seed is None


@pytest.mark.parametrize(
    ("canvas", "max_steps", "why"),
    [
        ([1] * (SERVED_CANVAS + 1), 1, "no larger than the served canvas"),
        ([1, 2], 0, "diffusion_max_steps must be a positive integer"),
        ([10_000, 2], 1, "diffusion_seed_canvas ids must be in"),
    ],
)
def test_malformed_reads_are_refused_at_admission(tiny, canvas, max_steps, why):
    with pytest.raises(VLLMValidationError, match=why):
        admitted(canvas_read_args(canvas, LABELS, max_steps), tiny.vocab)
