"""The logit prompts, pinned byte for byte per render version (tests/golden/<render_version>.json):
every question type and readout, in both label layouts (letters; words, and a question whose words fall
back to letters; in-context examples), on three chat templates (SmolLM2's ChatML, a Llama-3-style one, and one with no system
role).

RENDER_VERSION is a hash of the prompt code's own rendering of a fixed probe (prompt.probe_rendering), so a
change to the prompt text is a new version by itself, and its golden file is missing until regenerated with
``python -m tests.unit.test_golden`` (and ``python -m tests.unit.test_template_matrix``); review the diff
and delete the old version's files. A change the probe misses fails here under the old version's name.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import sys

from transformers import AutoTokenizer

from vllm.entrypoints.generate.decisions.decide.backends.logit import LogitBackend
from vllm.entrypoints.generate.decisions.decide.backends.logit.options import (
    LogitOptions,
)
from vllm.entrypoints.generate.decisions.decide.prompting.chat_template import (
    takes_system_role,
)
from vllm.entrypoints.generate.decisions.decide.prompting.labels import LabelCatalog
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import RENDER_VERSION
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    SCORE,
    ChoiceQuestion,
    CompiledQuestion,
    NoulQuestion,
    ScoreQuestion,
    choice_options,
)
from vllm.entrypoints.generate.decisions.decide.read_context import (
    Example,
    ReadContext,
)

from ..conftest import ROOT, model_path
from .fakes import TokenizerHost

GOLDEN = ROOT / "tests" / "golden" / f"{RENDER_VERSION}.json"
STATE = "Ticket: My payouts have been failing for 3 days."
LLAMA3_STYLE = (
    "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Gemma 2's turns, and its refusal of a system role: the instructions then open the user turn.
NO_SYSTEM_ROLE = (
    "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
TEMPLATES = {
    "smollm2-chatml": None,
    "llama3-style": LLAMA3_STYLE,
    "no-system-role": NO_SYSTEM_ROLE,
}
CASES = {
    "noul": (
        NOUL.compile(
            NoulQuestion(
                instructions="Is this urgent?", criteria={"true": "time-sensitive"}
            )
        ),
        {},
    ),
    "choice": (
        CHOICE.compile(
            ChoiceQuestion(
                instructions="Which team?",
                criteria={"billing": "Payments", "tech": None},
            )
        ),
        {},
    ),
    "typed_choice": (
        CompiledQuestion(
            CHOICE, "Flag?", choice_options([(True, "yes it is"), ("true", None)])
        ),
        {},
    ),
    "score": (
        SCORE.compile(
            ScoreQuestion(instructions={"rate": "mood"}, criteria=["Calm", "Angry"])
        ),
        {},
    ),
    "wide_direct": (
        CHOICE.compile(
            ChoiceQuestion(
                instructions="Which city?",
                criteria={f"city {i}": None for i in range(28)},
            )
        ),
        {},
    ),
    "two_stage": (
        CHOICE.compile(
            ChoiceQuestion(
                instructions="Which team?",
                criteria={"billing": "Payments", "tech": None, "sales": None},
            )
        ),
        {"readout": "two-stage", "shortlist": 2},
    ),
    # The words layout: Yes/No, level numbers (read after the cue's space), a choice's own values, and a
    # choice with a value that is not one token, which falls back to letters.
    "words_noul": (
        NOUL.compile(
            NoulQuestion(
                instructions="Is this urgent?", criteria={"true": "time-sensitive"}
            )
        ),
        {"labels": "words"},
    ),
    "words_score": (
        SCORE.compile(
            ScoreQuestion(
                instructions="How frustrated?", criteria=["Calm", "Angry", "Furious"]
            )
        ),
        {"labels": "words"},
    ),
    "words_choice": (
        CHOICE.compile(
            ChoiceQuestion(
                instructions="Which team?",
                criteria={"billing": "Payments", "technical": None, "sales": None},
            )
        ),
        {"labels": "words"},
    ),
    "words_fallback": (
        CHOICE.compile(
            ChoiceQuestion(
                instructions="Which team?",
                criteria={"billing": "Payments", "customer success": None},
            )
        ),
        {"labels": "words"},
    ),
    # In-context examples (calibration/examples.py): answered turns ahead of the state, in letters
    # and in words.
    "examples_choice": (
        CHOICE.compile(
            ChoiceQuestion(
                instructions="Which team?",
                criteria={"billing": "Payments", "tech": None},
            )
        ),
        {},
    ),
    "examples_words_noul": (
        NOUL.compile(
            NoulQuestion(
                instructions="Is this urgent?", criteria={"true": "time-sensitive"}
            )
        ),
        {"labels": "words"},
    ),
}
EXAMPLES = {
    "examples_choice": (
        Example("Ticket: I was charged twice.", '"billing"'),
        Example("Ticket: The app crashes on start.", '"tech"'),
    ),
    "examples_words_noul": (
        Example("Ticket: Server down, customers waiting.", "true"),
    ),
}


async def prompts_for(template: str | None) -> dict[str, list[str]]:
    tokenizer = AutoTokenizer.from_pretrained(model_path("smollm2-135m-instruct"))
    rendered: dict[str, list[str]] = {}
    for name, (question, options) in CASES.items():
        host = TokenizerHost(tokenizer, chat_template=template)
        backend = LogitBackend(host, LogitOptions(logprobs="exact", **options))
        backend.prompts.system_role = await takes_system_role(host)
        backend.catalog = LabelCatalog(backend.catalog.markers, ("AA", "AB"))
        backend.runner.catalog = backend.catalog
        context = ReadContext.about(STATE, "golden").with_examples(
            EXAMPLES.get(name, ())
        )
        await backend.read(question, context)
        rendered[name] = sorted(host.decode(prompt) for prompt, _ in host.reads)
    return rendered


@functools.cache
def smollm2_tokenizer():
    return AutoTokenizer.from_pretrained(model_path("smollm2-135m-instruct"))


async def example_prompts(template: str | None, state: str) -> list[list[int]]:
    """The token ids of examples_choice's prompts about ``state`` (in read order)."""
    question, _ = CASES["examples_choice"]
    host = TokenizerHost(smollm2_tokenizer(), chat_template=template)
    backend = LogitBackend(host, LogitOptions(logprobs="exact"))
    backend.prompts.system_role = await takes_system_role(host)
    context = ReadContext.about(state, "prefix").with_examples(
        EXAMPLES["examples_choice"]
    )
    await backend.read(question, context)
    return [list(prompt) for prompt, _ in host.reads]


def test_examples_sit_in_the_prefix_every_input_shares():
    """Two inputs asked the same question with the same examples: their prompts agree up to the
    last example's answer, so the engine's prefix cache prefills the examples once."""
    for template in TEMPLATES.values():
        first = asyncio.run(example_prompts(template, STATE))
        second = asyncio.run(example_prompts(template, "Ticket: Refund my order."))
        assert len(first) == len(second) > 0
        for a, b in zip(first, second, strict=True):
            shared = next(
                (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)),
            )
            common = smollm2_tokenizer().decode(a[:shared])
            # Both examples, each answered, are shared; the input's own words are not.
            assert common.count("Answer: ") == 2, common
            assert "The app crashes on start." in common, common
            assert common.endswith("Document:\nTicket:"), common


def rendered() -> dict[str, dict[str, list[str]]]:
    return {
        name: asyncio.run(prompts_for(template)) for name, template in TEMPLATES.items()
    }


def test_prompts_match_the_golden_file():
    assert GOLDEN.exists(), (
        f"no golden file for {RENDER_VERSION}: run python -m tests.unit.test_golden"
    )
    assert rendered() == json.loads(GOLDEN.read_text()), (
        f"the prompts differ from {GOLDEN.name} but the render version is the same: make prompt.probe_rendering "
        "cover the change (a new render version), then regenerate"
    )


def test_the_golden_files_are_this_render_versions_only():
    """A new version's files replace the old ones: none is left pinning a prompt nobody renders."""
    names = sorted(path.name for path in GOLDEN.parent.glob("*.json"))
    assert names == sorted([GOLDEN.name, f"templates-{RENDER_VERSION}.json"])


def test_the_render_version_is_the_prompts_hash(monkeypatch):
    """Any change to the prompt's text is a new render version (prompt.py derives it; nobody bumps it)."""
    from vllm.entrypoints.generate.decisions.decide.prompting import prompt

    assert (
        "direct-" + hashlib.sha256(prompt.probe_rendering().encode()).hexdigest()[:12]
        == RENDER_VERSION
    )
    before = prompt.probe_rendering()
    monkeypatch.setattr(prompt, "SYSTEM_PROMPT", prompt.SYSTEM_PROMPT + " ")
    assert prompt.probe_rendering() != before
    monkeypatch.undo()
    monkeypatch.setattr(
        prompt,
        "answer_instruction",
        lambda labels, words=False, numbered=False: "Pick one.",
    )
    assert prompt.probe_rendering() != before


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(rendered(), indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
