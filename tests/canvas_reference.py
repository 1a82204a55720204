"""A host that performs the canvas read with transformers' own DiffusionGemma on CPU, so the canvas
backend's whole logic (prompt, seeding, samples, averaging, refusals) runs against real model
arithmetic where vLLM's diffusion engine path cannot run (it needs Triton, i.e. a GPU).

One read: the prompt through the causal encoder (kept per prompt, as a prefix cache would keep it), then
the bidirectional decoder over the canvas; the log-softmax of the raw (soft-capped) logits at the first
canvas position is the read. Only one-step reads (``max_steps=1``): the first denoise's logits don't
depend on the engine's sampling, so this is exactly what a one-step engine read computes.
"""

from __future__ import annotations

import inspect
from http import HTTPStatus
from pathlib import Path

from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.host import TokenRead

from .unit.fakes import TokenizerHost


class DiffusionGemmaHost(TokenizerHost):
    def __init__(self, folder: Path, max_model_len: int = 1024) -> None:
        import torch
        from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

        super().__init__(
            AutoTokenizer.from_pretrained(folder), max_model_len=max_model_len
        )
        self.model = DiffusionGemmaForBlockDiffusion.from_pretrained(
            folder, dtype=torch.float32
        ).eval()
        self.architectures = ("DiffusionGemmaForBlockDiffusion",)
        self.vocab_size = self.model.config.get_text_config().vocab_size
        self.canvas_reads = True
        self.canvas_calls: list[tuple[list[int], list[int], list[int], int]] = []
        self._encoded: dict[tuple[int, ...], object] = {}
        # transformers names the KV cache argument ``cache`` (5.24, .venv) or ``past_key_values`` (5.19, .venv-0.32).
        self._cache_arg = (
            "cache"
            if "cache" in inspect.signature(self.model.forward).parameters
            else "past_key_values"
        )

    async def read_canvas(
        self, prompt_ids, canvas_ids, token_ids, max_steps, request_id
    ) -> TokenRead:
        import torch
        from transformers import DynamicCache

        self.canvas_calls.append(
            (list(prompt_ids), list(canvas_ids), list(token_ids), max_steps)
        )
        if max_steps != 1:
            raise DecisionError(
                "the reference host reads one denoising step only",
                HTTPStatus.NOT_IMPLEMENTED,
            )
        key = tuple(prompt_ids)
        cached = key in self._encoded
        with torch.no_grad():
            # the causal encoder fills the cache; the decoder only reads it
            if not cached:
                cache = DynamicCache(
                    config=self.model.config.get_text_config(decoder=True)
                )
                self.model.model.encoder(
                    input_ids=torch.tensor([prompt_ids]), **{self._cache_arg: cache}
                )
                self._encoded[key] = cache
            out = self.model(
                decoder_input_ids=torch.tensor([canvas_ids]),
                **{self._cache_arg: self._encoded[key]},
            )
        logprobs = out.logits[0, 0].float().log_softmax(-1)
        return TokenRead(
            {t: float(logprobs[t]) for t in token_ids},
            len(prompt_ids),
            len(prompt_ids) if cached else 0,
        )
