"""The template matrix (issue 20): how the logit backend's decision prompt meets each chat-template family.

For each family in tests/templates/families.py (tiny random-weight checkpoints built by setup.sh) it renders
the decision prompt with vLLM's own renderer, as the server does, and reports where the instructions go,
what closes the template's open ending, how many option letters and letter pairs are single tokens at the
answer slot, and whether the state renders once per request. With ``--engine`` it also starts each
checkpoint on an in-process vLLM engine (one process per family, about 20 s each here), runs the startup
self-check with VLLM_TYPED_DECISIONS_MIN_OPTION_MASS=0 (random weights show no option mass) and answers one
question on each wire.

usage: .venv/bin/python -m tools.checks.check_templates [--engine] [FAMILY ...]
Prints a Markdown table (docs/templates.md carries its output).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys

# The table is the output: vLLM's log goes to stderr.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

from tests.templates.families import BY_NAME, FAMILIES, Family  # noqa: E402
from tests.templates.matrix import (  # noqa: E402
    ENGINE_ENV,
    engine_checks,
    prompt_checks,
    renderer_host,
)

COLUMNS = [
    "family",
    "architecture",
    "tokenizer",
    "instructions",
    "open ending closed with",
    "letters",
    "pairs",
    "state once",
    "in the suite",
    "engine: start + both wires",
]
SUITE = {"serve": "prompt + vllm serve", "tokenizer": "prompt"}


def prompt_row(family: Family) -> dict[str, str]:
    found = asyncio.run(prompt_checks(renderer_host(family)))
    return {
        "family": family.title,
        "architecture": family.architecture,
        "tokenizer": family.tokenizer,
        "instructions": "system message" if found.system_role else "head of user turn",
        "open ending closed with": repr(found.closing) if found.closing else "-",
        "letters": f"{found.markers}/26",
        "pairs": str(found.pairs),
        "state once": "yes" if found.stencil else "no",
        "in the suite": SUITE[family.proven_by],
    }


def engine_cell(family: Family) -> str:
    """One family on an engine, in a child process (each engine holds its memory until its process ends)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.checks.check_templates",
            "--engine-child",
            family.name,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **ENGINE_ENV},
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return f"failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:100]}"
    result = json.loads(lines[-1])
    return f"started, {result['openai']} / {result['jev']}"


def engine_child(name: str) -> None:
    found = asyncio.run(engine_checks(BY_NAME[name]))
    print(
        json.dumps(
            {"openai": found.openai[0], "jev": found.jev[0], "startup": found.startup}
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("families", nargs="*", help="family names (default: all)")
    parser.add_argument(
        "--engine", action="store_true", help="also start each on an in-process engine"
    )
    parser.add_argument("--engine-child", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.engine_child:
        engine_child(options.engine_child)
        return 0
    families = (
        [BY_NAME[name] for name in options.families]
        if options.families
        else list(FAMILIES)
    )
    columns = COLUMNS if options.engine else COLUMNS[:-1]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for family in families:
        try:
            row = prompt_row(family)
        except (
            Exception
        ) as exc:  # a family that can't load or render is a finding, not a crash
            row = {
                "family": family.title,
                "architecture": f"error: {type(exc).__name__}: {exc}"[:160],
            }
        if options.engine:
            row["engine: start + both wires"] = engine_cell(family)
        print(
            "| "
            + " | ".join(
                row.get(c, "").replace("|", "\\|").replace("\n", "\\n") for c in columns
            )
            + " |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
