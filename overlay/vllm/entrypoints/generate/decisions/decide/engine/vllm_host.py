# SPDX-License-Identifier: Apache-2.0
"""The :class:`BackendHost` over a running vLLM engine client: chat rendering with the served
model's template, tokenizing, and each kind of read as one engine request (admitted under the
engine's queue limit, logged, aborted with its request), plus the engine arguments they need."""

from __future__ import annotations

import asyncio
import copy
import importlib.util
from collections.abc import Sequence
from dataclasses import replace
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, cast

from vllm.entrypoints.generate.decisions.decide.engine.requests import (
    canvas_read_args,
    engine_admission,
    engine_input,
    fp32_reads_missing,
    only,
)
from vllm.entrypoints.generate.decisions.decide.engine.token_bound import (
    chars_per_token,
)
from vllm.entrypoints.generate.decisions.decide.errors import (
    DecisionError,
    without_paths,
)
from vllm.entrypoints.generate.decisions.decide.host import (
    BackendHost,
    EncodedSpans,
    Generation,
    TokenRead,
)
from vllm.entrypoints.generate.decisions.decide.metrics import engine_read
from vllm.entrypoints.generate.decisions.decide.read_context import (
    ReadContext,
    as_context,
)
from vllm.entrypoints.generate.decisions.decide.vllm_versions import (
    BUILT_IN_CANVAS_READ,
)

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient
    from vllm.entrypoints.serve.utils.request_logger import RequestLogger
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams


def replica_for(replicas: int, state_sha256: str | None) -> int | None:
    """The data-parallel replica for reads about the state with this hash (None: let vLLM balance).
    vLLM balances each request on its own, so a decision's questions would each prefill the shared
    state on another replica; sent by its hash, the state is prefilled once and found cached."""
    if replicas <= 1 or not state_sha256:
        return None
    return int(state_sha256[:12], 16) % replicas


class VllmHost(BackendHost):
    """:class:`BackendHost` over a running vLLM engine client."""

    def __init__(
        self,
        engine_client: EngineClient,
        served_model: str,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        request_logger: RequestLogger | None = None,
    ) -> None:
        self.engine_client = engine_client
        # The LoRA adapter of reads whose context names none (:meth:`for_adapter`).
        self.adapter: LoRARequest | None = None
        # vLLM's request log (--enable-log-requests): one line per engine read.
        self.request_logger = request_logger
        self.served_model = served_model
        model_config = engine_client.model_config
        self.max_model_len = model_config.max_model_len
        self.architectures = tuple(
            getattr(model_config.hf_config, "architectures", None) or ()
        )
        self.max_logprobs = model_config.max_logprobs
        self.logprobs_mode = str(model_config.logprobs_mode)
        self.trust_remote_code = bool(model_config.trust_remote_code)
        self.vocab_size = int(model_config.get_vocab_size())
        vllm_config = engine_client.vllm_config
        parallel = vllm_config.parallel_config
        self.replicas = (
            1 if parallel.local_engines_only else parallel.data_parallel_size
        )
        # A diffusion model, and a vLLM that reads canvases: 0.32 itself, 0.30 with patches/00572.
        self.canvas_reads = bool(getattr(model_config, "is_diffusion", False)) and (
            BUILT_IN_CANVAS_READ
            or importlib.util.find_spec("vllm.v1.sample.canvas_read") is not None
        )
        self._model_config = model_config
        self.logit_dtype = str(model_config.head_dtype).removeprefix("torch.")
        self.fp32_reads_missing = fp32_reads_missing(vllm_config)
        self.priority_scheduling = vllm_config.scheduler_config.policy == "priority"
        from vllm.sampling_params import MAX_LOGPROB_TOKEN_IDS

        self.max_logprob_token_ids = MAX_LOGPROB_TOKEN_IDS
        self.renderer = engine_client.renderer
        self.tokenizer = self.renderer.get_tokenizer()
        self._chat_template = chat_template
        # Our own switches win over the server's defaults: the answer slot needs them.
        self._chat_template_kwargs = {
            **(chat_template_kwargs or {}),
            "add_generation_prompt": True,
            "enable_thinking": False,
        }
        self._special_ids = frozenset(self.tokenizer.all_special_ids) | frozenset(
            getattr(self.tokenizer, "added_tokens_decoder", {}) or ()
        )
        self.chars_per_token = chars_per_token(self.tokenizer)
        # vLLM's renderer's pool for blocking tokenizer calls, so ours queue with its own.
        self._tokenizing = getattr(self.renderer, "_executor", None)

    @property
    def chat_template(self) -> Any:
        """The chat template reads render with: ``--chat-template``'s, else the tokenizer's own."""
        return (
            self._chat_template
            if self._chat_template is not None
            else getattr(self.tokenizer, "chat_template", None)
        )

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        return dict(self._chat_template_kwargs)

    async def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        prompt = await self._render(messages, tokenize=True)
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        return self.encode(prompt["prompt"])

    async def render_chat_text(self, messages: list[dict[str, str]]) -> str | None:
        return (await self._render(messages, tokenize=False)).get("prompt")

    async def _render(
        self, messages: list[dict[str, str]], tokenize: bool
    ) -> dict[str, Any]:
        kwargs = self._chat_template_kwargs
        try:
            return await self._render_with(messages, kwargs, tokenize)
        except Exception:
            # Some templates refuse the thinking-off switch; render those without it.
            if "enable_thinking" not in kwargs:
                raise
            kwargs = dict(kwargs)
            del kwargs["enable_thinking"]
            prompt = await self._render_with(messages, kwargs, tokenize)
            self._chat_template_kwargs = kwargs
            return prompt

    async def _render_with(
        self, messages: list[dict[str, str]], kwargs: dict[str, Any], tokenize: bool
    ) -> dict[str, Any]:
        from vllm.renderers.params import ChatParams

        params = ChatParams(
            chat_template=self._chat_template,
            chat_template_kwargs={**kwargs, "tokenize": tokenize},
        )
        _, prompt = await self.renderer.render_messages_async(messages, params)
        return cast(dict[str, Any], prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_with_offsets(self, text: str) -> EncodedSpans | None:
        try:
            encoded = self.tokenizer(
                text, add_special_tokens=False, return_offsets_mapping=True
            )
        except (NotImplementedError, TypeError, ValueError):
            return None  # slow or custom tokenizers have no offsets
        return list(encoded["input_ids"]), [
            tuple(span) for span in encoded["offset_mapping"]
        ]

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids))

    async def encode_async(self, text: str) -> list[int]:
        return await asyncio.get_running_loop().run_in_executor(
            self._tokenizing, self.encode, text
        )

    async def encode_with_offsets_async(self, text: str) -> EncodedSpans | None:
        return await asyncio.get_running_loop().run_in_executor(
            self._tokenizing, self.encode_with_offsets, text
        )

    def special_token_ids(self) -> frozenset[int]:
        return self._special_ids

    def stopped_by(self, exc: BaseException) -> bool:
        """The engine client has stopped, or ``exc`` or its causes say it is stopping: EngineDeadError
        (the engine core died first, as on Ctrl-C), or a thread pool's refusal once vLLM's shutdown
        closed it (the renderer's, while the engine drains under ``--shutdown-timeout``)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        if getattr(self.engine_client, "errored", False):
            return True
        seen: set[int] = set()
        cause: BaseException | None = exc
        while cause is not None and id(cause) not in seen:
            if isinstance(cause, EngineDeadError) or (
                isinstance(cause, RuntimeError)
                and "cannot schedule new futures" in str(cause)
            ):
                return True
            seen.add(id(cause))
            cause = cause.__cause__ or cause.__context__
        return False

    async def read_token_logprobs(
        self,
        prompt_ids: list[int],
        token_ids: list[int],
        context: ReadContext[Any] | str,
        fp32: bool = False,
    ) -> TokenRead:
        # logprob_token_ids returns full-vocabulary log-probabilities of exactly these ids.
        params = self._one_token(fp32, logprob_token_ids=token_ids)
        return only(await self._read(prompt_ids, params, context, "exact"), token_ids)

    async def read_top_logprobs(
        self,
        prompt_ids: list[int],
        k: int,
        context: ReadContext[Any] | str,
        fp32: bool = False,
    ) -> TokenRead:
        params = self._one_token(fp32, logprobs=k)
        return await self._read(prompt_ids, params, context, "top_k")

    def _one_token(self, fp32: bool, **logprobs: Any) -> SamplingParams:
        """Sampling parameters for one greedy token's log-probabilities (``logprobs``: which), fp32
        values asked of patches/exact-logprobs where it is applied. prompt_logprobs stays unset: it
        would switch off prefix-cache reads. A read keeps no text, so nothing is detokenized."""
        from vllm.sampling_params import SamplingParams

        exact = fp32 and self.fp32_reads_missing is None
        return SamplingParams(
            max_tokens=1,
            temperature=0.0,
            detokenize=False,
            extra_args={"fp32_logprobs": True} if exact else None,
            **logprobs,
        )

    async def read_canvas(
        self,
        prompt_ids: list[int],
        canvas_ids: list[int],
        token_ids: list[int],
        max_steps: int,
        context: ReadContext[Any] | str,
    ) -> TokenRead:
        from vllm.sampling_params import SamplingParams

        params = SamplingParams(**canvas_read_args(canvas_ids, token_ids, max_steps))
        return only(await self._read(prompt_ids, params, context, "canvas"), token_ids)

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, context: ReadContext[Any] | str
    ) -> Generation:
        from vllm.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        final = await self._final(prompt_ids, params, context, "generate")
        if final is None or not final.outputs:
            raise DecisionError(
                "the engine generated nothing", HTTPStatus.INTERNAL_SERVER_ERROR
            )
        out = final.outputs[0]
        return Generation(
            out.text,
            list(out.token_ids),
            len(prompt_ids),
            int(final.num_cached_tokens or 0),
        )

    async def pool(
        self, prompt_ids: list[int], task: str, context: ReadContext[Any] | str
    ) -> Any:
        from vllm.pooling_params import PoolingParams

        try:
            params = PoolingParams(task=cast(Any, task))
            final = await self._final(prompt_ids, params, context, "pool")
        except ValueError as exc:  # the served model doesn't support this pooling task
            raise DecisionError(
                f"pooling ({task}) is not available on this model: {without_paths(str(exc))}"
            ) from None
        if final is None:
            raise DecisionError(
                "the engine returned no pooling output",
                HTTPStatus.INTERNAL_SERVER_ERROR,
            )
        data = final.outputs.data
        return data.tolist() if hasattr(data, "tolist") else data

    def for_adapter(self, adapter: LoRARequest) -> VllmHost:
        """This host reading through LoRA ``adapter`` wherever a read's context names no adapter: the
        backend and calibration of an adapter's decision service build contexts of their own (adapters.py)."""
        bound = copy.copy(self)
        bound.adapter = adapter
        return bound

    def checkpoint_config(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._model_config.hf_config.to_dict())

    def checkpoint_file(self, name: str) -> bytes | None:
        from vllm.transformers_utils.repo_utils import get_hf_file_bytes

        config = self._model_config
        return get_hf_file_bytes(name, config.model, config.revision)

    async def _final(
        self,
        prompt_ids: list[int],
        params: Any,
        context: ReadContext[Any] | str,
        kind: str,
    ) -> Any:
        """One engine request, admitted, logged and timed as a ``kind`` read, through this host's
        adapter where ``context`` names none; its last output (None: none)."""
        read = as_context(context)
        if read.adapter is None and self.adapter is not None:
            read = replace(read, adapter=self.adapter)
        submit: Any = self.engine_client.generate
        route = {"data_parallel_rank": replica_for(self.replicas, read.state_sha256)}
        if kind == "pool":  # a pooling request takes no data-parallel rank
            submit, route = self.engine_client.encode, {}
        final = None
        with engine_admission(), engine_read(kind):
            if self.request_logger is not None:
                self.request_logger.log_inputs(
                    read.request_id,
                    None,
                    prompt_ids,
                    None,
                    params=params,
                    lora_request=read.adapter,
                )
            async for output in submit(
                engine_input(prompt_ids, read),
                params,
                read.request_id,
                lora_request=read.adapter,
                priority=read.priority,
                **route,
            ):
                final = output
        return final

    async def _read(
        self,
        prompt_ids: list[int],
        params: Any,
        context: ReadContext[Any] | str,
        kind: str,
    ) -> TokenRead:
        final = await self._final(prompt_ids, params, context, kind)
        if final is None or not final.outputs or not final.outputs[0].logprobs:
            raise DecisionError(
                "the engine returned no log-probabilities",
                HTTPStatus.INTERNAL_SERVER_ERROR,
            )
        position = final.outputs[0].logprobs[0]
        return TokenRead(
            logprobs={int(t): float(p.logprob) for t, p in position.items()},
            prompt_tokens=len(prompt_ids),
            cached_tokens=int(final.num_cached_tokens or 0),
        )
