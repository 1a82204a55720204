"""Fit a calibration temperature offline from captured option logits (tools/quality/capture_logits.py output).

Runs exactly the server's startup calibration maths on the same logits: golden-section fit of T over
[0.05, 20], 5-fold group-kept cross-validation, 10-bin ECE with 95% group-bootstrap intervals, and the
keep rule. Use the printed T as VLLM_TYPED_DECISIONS_TEMPERATURE, or per request as
extra.calibration_temperature.

usage: python -m tools.quality.fit_temperature CAPTURED.jsonl [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys

from vllm.entrypoints.generate.decisions.calibration.maths import (
    CalibrationResult,
    Labelled,
    calibrate,
)


def fit(path: str, seed: int = 0) -> CalibrationResult:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return calibrate(
        Labelled(
            [r["scores"] for r in rows],
            [r["correct"] for r in rows],
            [r["group"] for r in rows],
        ),
        seed=seed,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("captured")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    r = fit(args.captured, args.seed)
    print(
        f"T={r.temperature:.3f} {'kept' if r.kept else 'not kept (apply T=1.0)'}{' AT EDGE' if r.at_edge else ''}"
    )
    print(
        f"ECE raw {r.ece_raw:.3f} [{r.ece_raw_interval[0]:.3f}, {r.ece_raw_interval[1]:.3f}] -> "
        f"calibrated (held out) {r.ece_calibrated:.3f} "
        f"[{r.ece_calibrated_interval[0]:.3f}, {r.ece_calibrated_interval[1]:.3f}], {r.questions} questions"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
