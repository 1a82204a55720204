# SPDX-License-Identifier: Apache-2.0
"""Checks a new labelled question file against the existing ones before it is used.

    python -m tools.quality.data.check_overlap tools/quality/data/heldout-b.jsonl

- No run of 8 words of any new input appears in heldout.jsonl, labels.jsonl or the bundled
  calibration file (any string in their lines: inputs and question wording).
- Every question of the new file is a byte-identical copy of the heldout.jsonl question of the same
  domain and short name (the group's prefix and the id's last part), so fingerprints match.
- Prints each question's label balance and the majority baseline (each question's most common
  answer share, averaged over questions). Exits 1 on any overlap or question mismatch.

Needs only the standard library.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tools/quality/data"
REFERENCES = [
    DATA / "heldout.jsonl",
    DATA / "labels.jsonl",
    ROOT / "overlay/vllm/entrypoints/generate/decisions/calibration/bundled.jsonl",
]
RUN = 8


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+(?:'[a-z]+)?", text.lower())


def strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def runs(text: str) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i : i + RUN]) for i in range(len(w) - RUN + 1)}


def read(path: Path) -> list[dict]:
    return [
        json.loads(line)
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


def key(line: dict) -> tuple[str, str]:
    return line["group"].split("-")[0], line["id"].rsplit("-", 1)[1]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    new_path = Path(argv[1])
    new = read(new_path)
    failed = False

    for ref in REFERENCES:
        seen: set[tuple[str, ...]] = set()
        for line in read(ref):
            for s in strings(line):
                seen |= runs(s)
        states = {line["state"] for line in new}
        hits = [(s, r) for s in states for r in runs(s) if r in seen]
        print(f"{ref.relative_to(ROOT)}: {len(hits)} shared {RUN}-word runs")
        for s, r in hits[:10]:
            print("   ", " ".join(r), "| in:", s[:80].replace("\n", " "))
        failed |= bool(hits)

    heldout = {}
    for line in read(DATA / "heldout.jsonl"):
        heldout.setdefault(key(line), json.dumps(line["question"], ensure_ascii=False))
    mismatched = [
        line["id"]
        for line in new
        if heldout.get(key(line)) != json.dumps(line["question"], ensure_ascii=False)
    ]
    print(
        f"questions differing from heldout.jsonl's: {len(mismatched)}", mismatched[:10]
    )
    failed |= bool(mismatched)

    answers: dict[tuple[str, str], Counter] = {}
    types = {}
    for line in new:
        answers.setdefault(key(line), Counter())[str(line["expected"])] += 1
        types[key(line)] = line["question"]["type"]
    shares = []
    print(
        f"\n{len(new)} lines, {len({line['group'] for line in new})} inputs, {len(answers)} questions"
    )
    for (domain, short), counts in answers.items():
        n = sum(counts.values())
        shares.append(max(counts.values()) / n)
        if types[(domain, short)] == "noul":
            shown = f"yes {counts['yes']}/{n}"
        else:
            shown = ", ".join(f"{a}: {c}" for a, c in sorted(counts.items()))
        print(f"| {domain} | {short} | {types[(domain, short)]} | {shown} |")
    print(f"majority baseline: {sum(shares) / len(shares):.3f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
