"""The logit prompt, pinned byte for byte per render version (tests/golden/<render_version>.json).

A change to the prompt text must come with a new RENDER_VERSION and a new golden file:
regenerate it with ``python -m tests.unit.test_golden`` and review the diff.
"""

from __future__ import annotations

import json
import sys

from vllm.entrypoints.generate.decisions.backends.logit.prompt import RENDER_VERSION, messages, option_letters
from vllm.entrypoints.generate.decisions.questions import (
    CHOICE,
    NOUL,
    SCORE,
    ChoiceQuestion,
    CompiledQuestion,
    NoulQuestion,
    ScoreQuestion,
    choice_options,
)

from ..conftest import ROOT

GOLDEN = ROOT / "tests" / "golden" / f"{RENDER_VERSION}.json"
STATE = "Ticket: My payouts have been failing for 3 days."
QUESTIONS = {
    "noul": NOUL.compile(NoulQuestion(instructions="Is this urgent?", criteria={"true": "time-sensitive"})),
    "choice": CHOICE.compile(
        ChoiceQuestion(instructions="Which team?", criteria={"billing": "Payments", "tech": None})
    ),
    "typed_choice": CompiledQuestion(CHOICE, "Flag?", choice_options([(True, "yes it is"), ("true", None)])),
    "score": SCORE.compile(ScoreQuestion(instructions={"rate": "mood"}, criteria=["Calm", "Angry"])),
}


def rendered() -> dict[str, list[dict[str, str]]]:
    return {name: messages(STATE, q, option_letters(len(q.options))) for name, q in QUESTIONS.items()}


def test_prompt_matches_the_golden_file():
    assert GOLDEN.exists(), f"no golden file for {RENDER_VERSION}: run python -m tests.unit.test_golden"
    assert rendered() == json.loads(GOLDEN.read_text())


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(rendered(), indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
