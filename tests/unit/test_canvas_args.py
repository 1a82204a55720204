"""The canvas read's engine arguments (``host.canvas_read_args``) on both vLLM versions, and VllmHost sending
them: on 0.30 patches/00572's ``canvas_read`` as before, on 0.32 upstream's built-in ``diffusion_*`` read with
the same meaning (the canvas as given, only position 0 free, a step cap, full-vocabulary log-probabilities at
position 0). tests/unit/test_canvas_read_v032.py puts the 0.32 arguments through vLLM 0.32's own checks."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from vllm.entrypoints.generate.decisions.decide.engine.requests import canvas_read_args
from vllm.entrypoints.generate.decisions.decide.engine.vllm_host import VllmHost
from vllm.entrypoints.generate.decisions.decide.vllm_versions import (
    BUILT_IN_CANVAS_READ,
    VLLM_RELEASE,
)

# Also run on vLLM 0.32 (tools/test.sh's second pass): these touch vLLM's own APIs.
pytestmark = pytest.mark.vllm032

LABELS = [235, 236]


def test_on_030_the_read_is_patch_00572s_canvas_read():
    assert canvas_read_args([417, 106], LABELS, 3, built_in=False) == {
        "max_tokens": 1,
        "logprob_token_ids": LABELS,
        "detokenize": False,
        "extra_args": {
            "canvas_read": {"canvas": [417, 106], "slots": [0], "max_steps": 3}
        },
    }


def test_on_032_the_read_seeds_the_canvas_and_pins_every_position_but_0():
    assert canvas_read_args([417, 106, 0, 0], LABELS, 2, built_in=True) == {
        "max_tokens": 4,  # one canvas is the whole output of a read-only request
        "logprob_token_ids": LABELS,
        "detokenize": False,
        "extra_args": {
            "diffusion_seed_canvas": [417, 106, 0, 0],
            "diffusion_canvas_length": 4,
            "diffusion_pinned": [1, 2, 3],
            "diffusion_max_steps": 2,
            "diffusion_read_only": True,
        },
    }


def test_the_installed_vllm_picks_the_read():
    read = canvas_read_args([1, 2], LABELS, 1)["extra_args"]
    assert ("diffusion_read_only" in read) is (VLLM_RELEASE >= (0, 32))
    assert ("canvas_read" in read) is (VLLM_RELEASE < (0, 32))


class Engine:
    """An engine client that records each request and answers with scripted position-0 log-probabilities."""

    def __init__(self, diffusion: bool = True) -> None:
        self.model_config = SimpleNamespace(
            max_model_len=1024,
            hf_config=SimpleNamespace(
                architectures=["DiffusionGemmaForBlockDiffusion"]
            ),
            max_logprobs=20,
            logprobs_mode="raw_logprobs",
            trust_remote_code=False,
            is_diffusion=diffusion,
            head_dtype="torch.float32",
            get_vocab_size=lambda: 1000,
        )
        self.vllm_config = SimpleNamespace(
            model_config=self.model_config,
            parallel_config=SimpleNamespace(
                local_engines_only=True, data_parallel_size=1
            ),
            scheduler_config=SimpleNamespace(policy="fcfs"),
        )
        tokenizer = SimpleNamespace(all_special_ids=[], added_tokens_decoder={})
        self.renderer = SimpleNamespace(get_tokenizer=lambda: tokenizer)
        self.requests: list[tuple[object, object]] = []

    async def generate(
        self,
        prompt,
        params,
        request_id,
        lora_request=None,
        priority=0,
        data_parallel_rank=None,
    ):
        self.requests.append((prompt, params))
        position = {
            t: SimpleNamespace(logprob=-1.0 - i) for i, t in enumerate([*LABELS, 999])
        }
        yield SimpleNamespace(
            outputs=[SimpleNamespace(logprobs=[position])], num_cached_tokens=3
        )


def test_a_diffusion_model_reads_canvases_where_the_installed_vllm_can():
    can = (
        BUILT_IN_CANVAS_READ
        or importlib.util.find_spec("vllm.v1.sample.canvas_read") is not None
    )
    assert VllmHost(Engine(), "m").canvas_reads == can  # type: ignore[arg-type]
    assert not VllmHost(Engine(diffusion=False), "m").canvas_reads  # type: ignore[arg-type]


@pytest.mark.parametrize("max_steps", [1, 4])
async def test_read_canvas_sends_the_installed_vllms_read_and_keeps_the_asked_ids(
    max_steps,
):
    engine = Engine()
    host = VllmHost(engine, "m")  # type: ignore[arg-type]
    read = await host.read_canvas([5, 6, 7], [417, 106], LABELS, max_steps, "req-1")
    ((_, params),) = engine.requests
    want = canvas_read_args([417, 106], LABELS, max_steps)
    assert (
        params.max_tokens == want["max_tokens"]
        and params.extra_args == want["extra_args"]
    )
    assert (
        list(params.logprob_token_ids) == LABELS
        and params.temperature == 1.0
        and params.seed is None
    )
    assert read.logprobs == {
        LABELS[0]: -1.0,
        LABELS[1]: -2.0,
    }  # the engine's own sampled token is dropped
    assert (read.prompt_tokens, read.cached_tokens) == (3, 3)
