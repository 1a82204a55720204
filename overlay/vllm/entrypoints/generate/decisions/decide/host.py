# SPDX-License-Identifier: Apache-2.0
"""The one door from a backend to the engine.

Backends render prompts, tokenize and read log-probabilities only through a :class:`BackendHost`.
:class:`VllmHost` implements it over vLLM's engine client; unit tests implement it with fakes.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, cast

from vllm.entrypoints.generate.decisions.decide.affinity import replica_for
from vllm.entrypoints.generate.decisions.decide.errors import (
    DecisionError,
    EngineBusyError,
    without_paths,
)
from vllm.entrypoints.generate.decisions.decide.metrics import engine_read
from vllm.entrypoints.generate.decisions.decide.read_context import (
    ReadContext,
    as_context,
)
from vllm.entrypoints.generate.decisions.decide.token_bound import (
    chars_per_token,
)
from vllm.entrypoints.generate.decisions.decide.vllm_versions import (
    BUILT_IN_CANVAS_READ,
)

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient
    from vllm.entrypoints.serve.utils.request_logger import RequestLogger
    from vllm.lora.request import LoRARequest


@dataclass(frozen=True)
class TokenRead:
    """Next-token log-probabilities at the position after a prompt, with token accounting.

    For an exact read, ``logprobs`` holds the requested ids the engine returned (an incomplete read,
    as under speculative decoding, lacks some); for a top-k read, the k most likely tokens.
    """

    logprobs: dict[int, float]
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Generation:
    """Greedy continuation of a prompt."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int


class BackendHost(ABC):
    """What a backend may ask of the serving engine.

    Every engine call takes the question's :class:`ReadContext` (``context.part(...)`` for each of several
    calls): its request id names the call in vLLM's request log, its state picks the engine replica
    under data parallelism, and its adapter is the LoRA adapter the engine reads through. A bare request
    id still works, for plugins written before contexts.
    """

    served_model: str
    max_model_len: int
    architectures: tuple[str, ...]
    # --max-logprobs: the widest top-k read (-1: the whole vocabulary).
    max_logprobs: int
    # MAX_LOGPROB_TOKEN_IDS: the most token ids one exact read may name.
    max_logprob_token_ids: int
    # --logprobs-mode: only "raw_logprobs" returns true log-probabilities.
    logprobs_mode: str
    # --trust-remote-code: whether code shipped with the checkpoint may run.
    trust_remote_code: bool = False
    # The served tokenizer, for backends whose checkpoint builds its own prompts (None: not available).
    tokenizer: Any = None
    # The model's vocabulary size (0: unknown), e.g. for drawing noise tokens.
    vocab_size: int = 0
    # Whether the engine can do read-only canvas reads (:meth:`read_canvas`): a diffusion model on vLLM
    # 0.32, or on 0.30 with patches/00572.
    canvas_reads: bool = False
    # The dtype the LM head computes logits in ("bfloat16", "float16", "float32").
    logit_dtype: str = "float32"
    # Why reads can't ask for fp32 log-probabilities under a half-precision LM head (None: they can,
    # a vLLM with patches/exact-logprobs; see :meth:`read_token_logprobs`).
    fp32_reads_missing: str | None = "this host can't recompute logits"
    # Whether the engine schedules by a request's priority (vllm serve --scheduling-policy priority); where
    # it doesn't, the service refuses a priority other than 0. Reads pass ``context.priority`` and
    # ``context.cache_salt`` to the engine as vLLM's own APIs do.
    priority_scheduling: bool = False
    # The most characters of prompt text one token can stand for (None: no sure bound), so a prompt too
    # long for the context is refused by its length before it is tokenized (token_bound.py).
    chars_per_token: int | None = None

    @abstractmethod
    async def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """The served chat template applied to ``messages``, ready for the assistant's first token
        (generation prompt on, thinking off), as token ids."""

    async def render_chat_text(self, messages: list[dict[str, str]]) -> str | None:
        """The same rendering as :meth:`render_chat`, as text (None: this host can't give text)."""
        return None

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of plain text, without special tokens."""

    def encode_with_offsets(
        self, text: str
    ) -> tuple[list[int], list[tuple[int, int]]] | None:
        """:meth:`encode` with each token's (start, end) character span (None: not available)."""
        return None

    @abstractmethod
    def decode(self, token_ids: Sequence[int]) -> str: ...

    async def encode_async(self, text: str) -> list[int]:
        """:meth:`encode` in a worker thread: a long text must not hold up the server's other clients."""
        return await asyncio.to_thread(self.encode, text)

    async def encode_with_offsets_async(
        self, text: str
    ) -> tuple[list[int], list[tuple[int, int]]] | None:
        """:meth:`encode_with_offsets` in a worker thread."""
        return await asyncio.to_thread(self.encode_with_offsets, text)

    @abstractmethod
    def special_token_ids(self) -> frozenset[int]:
        """Ids the tokenizer never produces from plain text (template markers and the like)."""

    @abstractmethod
    async def read_token_logprobs(
        self,
        prompt_ids: list[int],
        token_ids: list[int],
        context: ReadContext[Any] | str,
        fp32: bool = False,
    ) -> TokenRead:
        """One forward pass over ``prompt_ids``: the next-token log-probability of each of
        ``token_ids`` over the full vocabulary. No token is kept. ``fp32``: recompute the returned
        values in fp32 where :attr:`fp32_reads_missing` is None (ignored elsewhere)."""

    @abstractmethod
    async def read_top_logprobs(
        self,
        prompt_ids: list[int],
        k: int,
        context: ReadContext[Any] | str,
        fp32: bool = False,
    ) -> TokenRead:
        """One forward pass over ``prompt_ids``: the ``k`` most likely next tokens and their
        log-probabilities (``k = -1``: the whole vocabulary); ``fp32`` as for :meth:`read_token_logprobs`."""

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, context: ReadContext[Any] | str
    ) -> Generation:
        """Greedy generation of up to ``max_tokens`` tokens (for backends that read generated text)."""
        raise DecisionError("this host cannot generate", HTTPStatus.NOT_IMPLEMENTED)

    async def pool(
        self, prompt_ids: list[int], task: str, context: ReadContext[Any] | str
    ) -> Any:
        """One pooling pass (for pooling models, e.g. ``token_classify``): the pooler's output as lists."""
        raise DecisionError("this host cannot pool", HTTPStatus.NOT_IMPLEMENTED)

    async def read_canvas(
        self,
        prompt_ids: list[int],
        canvas_ids: list[int],
        token_ids: list[int],
        max_steps: int,
        context: ReadContext[Any] | str,
    ) -> TokenRead:
        """A read-only canvas read (diffusion models): the canvas after ``prompt_ids`` starts as
        ``canvas_ids``, only its first position may change, the engine denoises at most ``max_steps``
        times, and the result is the log-probability of each of ``token_ids`` at that first position."""
        raise DecisionError(
            "this engine has no canvas read (patches/00572)", HTTPStatus.NOT_IMPLEMENTED
        )

    def checkpoint_config(self) -> dict[str, Any]:
        """The served checkpoint's ``config.json`` as a dict."""
        return {}

    def checkpoint_file(self, name: str) -> bytes | None:
        """A file shipped with the served checkpoint (None: it has none by that name)."""
        return None


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
        # The LoRA adapter of reads whose context names none (:meth:`for_adapter`): None, the base model.
        self.adapter: LoRARequest | None = None
        # vLLM's request log (--enable-log-requests): one line per engine read, under its request id.
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
        # Under data parallelism with vLLM's internal load balancer, reads about one state go to one replica.
        parallel = engine_client.vllm_config.parallel_config
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
        self.fp32_reads_missing = fp32_reads_missing(engine_client.vllm_config)
        self.priority_scheduling = (
            engine_client.vllm_config.scheduler_config.policy == "priority"
        )
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
        # vLLM's own pool for blocking tokenizer calls (its renderer's), so ours queue with its own; the
        # default pool where a vLLM has none.
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
        prompt = await self._render(messages, tokenize=False)
        return prompt.get("prompt")

    async def _render(
        self, messages: list[dict[str, str]], tokenize: bool
    ) -> dict[str, Any]:
        try:
            return await self._render_with(
                messages, {**self._chat_template_kwargs, "tokenize": tokenize}
            )
        except Exception:
            # Some templates refuse the thinking-off switch; render those without it.
            if "enable_thinking" not in self._chat_template_kwargs:
                raise
            kwargs = {
                k: v
                for k, v in self._chat_template_kwargs.items()
                if k != "enable_thinking"
            }
            prompt = await self._render_with(messages, {**kwargs, "tokenize": tokenize})
            self._chat_template_kwargs = kwargs
            return prompt

    async def _render_with(
        self, messages: list[dict[str, str]], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        from vllm.renderers.params import ChatParams

        params = ChatParams(
            chat_template=self._chat_template, chat_template_kwargs=kwargs
        )
        _, prompt = await self.renderer.render_messages_async(messages, params)
        return cast(dict[str, Any], prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_with_offsets(
        self, text: str
    ) -> tuple[list[int], list[tuple[int, int]]] | None:
        try:
            encoded = self.tokenizer(
                text, add_special_tokens=False, return_offsets_mapping=True
            )
        # slow or custom tokenizers have no offsets
        except (
            NotImplementedError,
            TypeError,
            ValueError,
        ):
            return None
        return list(encoded["input_ids"]), [
            tuple(span) for span in encoded["offset_mapping"]
        ]

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids))

    async def encode_async(self, text: str) -> list[int]:
        return await asyncio.get_running_loop().run_in_executor(
            self._tokenizing, self.encode, text
        )

    async def encode_with_offsets_async(
        self, text: str
    ) -> tuple[list[int], list[tuple[int, int]]] | None:
        return await asyncio.get_running_loop().run_in_executor(
            self._tokenizing, self.encode_with_offsets, text
        )

    def special_token_ids(self) -> frozenset[int]:
        return self._special_ids

    async def read_token_logprobs(
        self,
        prompt_ids: list[int],
        token_ids: list[int],
        context: ReadContext[Any] | str,
        fp32: bool = False,
    ) -> TokenRead:
        from vllm.sampling_params import SamplingParams

        # logprob_token_ids returns full-vocabulary log-probabilities of exactly these ids.
        # prompt_logprobs stays unset: it would switch off prefix-cache reads. A read keeps no text,
        # so nothing is detokenized.
        params = SamplingParams(
            max_tokens=1,
            temperature=0.0,
            logprob_token_ids=token_ids,
            detokenize=False,
            extra_args=self._fp32_args(fp32),
        )
        return only(
            await self._read(prompt_ids, params, self._context(context), "exact"),
            token_ids,
        )

    async def read_top_logprobs(
        self,
        prompt_ids: list[int],
        k: int,
        context: ReadContext[Any] | str,
        fp32: bool = False,
    ) -> TokenRead:
        from vllm.sampling_params import SamplingParams

        params = SamplingParams(
            max_tokens=1,
            temperature=0.0,
            logprobs=k,
            detokenize=False,
            extra_args=self._fp32_args(fp32),
        )
        return await self._read(prompt_ids, params, self._context(context), "top_k")

    def _fp32_args(self, fp32: bool) -> dict[str, Any] | None:
        """``extra_args`` asking patches/exact-logprobs for fp32 values (None: not asked, or no patch)."""
        return (
            {"fp32_logprobs": True}
            if fp32 and self.fp32_reads_missing is None
            else None
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
        return only(
            await self._read(prompt_ids, params, self._context(context), "canvas"),
            token_ids,
        )

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, context: ReadContext[Any] | str
    ) -> Generation:
        from vllm.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        final = await self._final(
            prompt_ids, params, self._context(context), "generate"
        )
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

        read, final = self._context(context), None
        try:
            params = PoolingParams(task=cast(Any, task))
            # metrics.py: engine-read latency
            with (
                engine_admission(),
                engine_read("pool"),
            ):
                self._log(read, prompt_ids, params)
                async for output in self.engine_client.encode(
                    engine_input(prompt_ids, read),
                    params,
                    read.request_id,
                    lora_request=read.adapter,
                    priority=read.priority,
                ):
                    final = output
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

    def _log(
        self, context: ReadContext[Any], prompt_ids: list[int], params: Any
    ) -> None:
        if self.request_logger is not None:
            self.request_logger.log_inputs(
                context.request_id,
                None,
                prompt_ids,
                None,
                params=params,
                lora_request=context.adapter,
            )

    def for_adapter(self, adapter: LoRARequest) -> VllmHost:
        """This host reading through LoRA ``adapter`` wherever a read's context names no adapter: the
        backend and calibration of an adapter's decision service build contexts of their own (adapters.py)."""
        bound = copy.copy(self)
        bound.adapter = adapter
        return bound

    def _context(self, context: ReadContext[Any] | str) -> ReadContext[Any]:
        """A read's context, naming this host's adapter when it names none."""
        read = as_context(context)
        return (
            replace(read, adapter=self.adapter)
            if read.adapter is None and self.adapter is not None
            else read
        )

    def checkpoint_config(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._model_config.hf_config.to_dict())

    def checkpoint_file(self, name: str) -> bytes | None:
        from vllm.transformers_utils.repo_utils import get_hf_file_bytes

        config = self._model_config
        return get_hf_file_bytes(name, config.model, config.revision)

    def _replica(self, context: ReadContext[Any]) -> int | None:
        return replica_for(self.replicas, context.state_sha256)

    async def _final(
        self, prompt_ids: list[int], params: Any, context: ReadContext[Any], kind: str
    ) -> Any:
        """One engine request, admitted and timed as a ``kind`` read; its last output (None: none)."""
        final = None
        with engine_admission(), engine_read(kind):  # metrics.py: engine-read latency
            self._log(context, prompt_ids, params)
            async for output in self.engine_client.generate(
                engine_input(prompt_ids, context),
                params,
                context.request_id,
                lora_request=context.adapter,
                priority=context.priority,
                data_parallel_rank=self._replica(context),
            ):
                final = output
        return final

    async def _read(
        self, prompt_ids: list[int], params: Any, context: ReadContext[Any], kind: str
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


def engine_input(prompt_ids: list[int], context: ReadContext[Any]) -> Any:
    """The engine's input for a read: the prompt's tokens, salted with the client's ``cache_salt`` when it
    sent one (vLLM then shares prefix-cache blocks only among reads with the same salt)."""
    from vllm.inputs import tokens_input

    return tokens_input(prompt_ids, cache_salt=context.cache_salt)


def fp32_reads_missing(vllm_config: Any) -> str | None:
    """Why this engine can't recompute read log-probabilities in fp32 (None: it can)."""
    if str(vllm_config.model_config.head_dtype) == "torch.float32":
        return None  # the LM head computes fp32 logits already
    if importlib.util.find_spec("vllm.v1.sample.exact_logprobs") is None:
        return (
            "this vLLM lacks patches/exact-logprobs-v0.30.patch (install.sh applies it)"
        )
    from vllm.v1.sample.exact_logprobs import unsupported_reason

    return unsupported_reason(vllm_config)


def canvas_read_args(
    canvas_ids: list[int],
    token_ids: list[int],
    max_steps: int,
    built_in: bool = BUILT_IN_CANVAS_READ,
) -> dict[str, Any]:
    """``SamplingParams`` arguments for :meth:`BackendHost.read_canvas`: the canvas after the prompt starts
    as ``canvas_ids``, only its position 0 may change, the engine denoises at most ``max_steps`` times, and
    the request returns the log-probability of each of ``token_ids`` at position 0 over the whole
    vocabulary. Diffusion models take temperature 1.0 and no engine seed: both stay at their defaults.

    ``built_in`` (vLLM 0.32, vllm/utils/diffusion.py): every position but 0 is pinned to its seed, and the
    read-only request ends on its last denoise step with temperature-1 log-probabilities. ``max_tokens``
    is the canvas width, what upstream's validation gives a read-only request that names none (and, at
    width 2, what upstream's own canvas read asks for). ``diffusion_constrained`` stays off: it would
    renormalize over ``token_ids``. Otherwise (0.30): patches/00572's ``canvas_read``, with max_tokens=1."""
    if built_in:
        extra: dict[str, Any] = {
            "diffusion_seed_canvas": canvas_ids,
            "diffusion_canvas_length": len(canvas_ids),
            "diffusion_pinned": list(range(1, len(canvas_ids))),
            "diffusion_max_steps": max_steps,
            "diffusion_read_only": True,
        }
        max_tokens = len(canvas_ids)
    else:
        extra = {
            "canvas_read": {"canvas": canvas_ids, "slots": [0], "max_steps": max_steps}
        }
        max_tokens = 1
    return {
        "max_tokens": max_tokens,
        "logprob_token_ids": token_ids,
        "detokenize": False,
        "extra_args": extra,
    }


def only(read: TokenRead, token_ids: Sequence[int]) -> TokenRead:
    """``read`` without the tokens nobody asked for (the engine adds the sampled one)."""
    wanted = set(token_ids)
    return TokenRead(
        {t: v for t, v in read.logprobs.items() if t in wanted},
        read.prompt_tokens,
        read.cached_tokens,
    )


@contextmanager
def engine_admission() -> Iterator[None]:
    """Turns the engine's refusal of a request over its queue limits into :class:`EngineBusyError`."""
    from vllm.exceptions import MaxQueuedTokensError, QueueOverflowError

    try:
        yield
    except QueueOverflowError:
        raise EngineBusyError("--max-num-queued-reqs") from None
    except MaxQueuedTokensError:
        raise EngineBusyError("--max-num-queued-tokens") from None
