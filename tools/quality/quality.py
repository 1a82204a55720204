"""How far the decision probabilities can be trusted, per question type and overall, for several server
configurations side by side in one run against one real server.

Starts its own `vllm serve` (decisions on, a fresh calibration folder, startup calibration off so no T is
applied behind the figures' back) unless --port targets a running one. Over a labelled file in the
calibration format (the bundled set by default) it asks every question once per configuration
(through /v1/systemone, ``extra.backend_options.precision`` and ``extra.debias``) and measures, from
the raw option logits (T = 1):

- accuracy and the majority baseline (always the most common correct option position of that type);
- log loss and Brier score of the raw probabilities;
- ECE with its 95% group-bootstrap interval: raw, and held out (5-fold, group-disjoint) with one
  temperature fitted over all types against one per type, by the server's own calibration maths;
- the share of answers whose two top options tie exactly;
- order consistency: for choice questions, the share whose top option stays the same when the options
  are sent in --orders other random orders (a score's levels are its scale, yes/no has no order);
- option mass (the next-token probability on the labels) and seconds per decision (each question goes
  through every configuration in turn, in a shuffled order, with --concurrency questions in flight).

Then a cost phase: one question (6 options) about a ~1,000-token input, each request a new input, with
the configurations interleaved request by request; seconds per decision and the ratio to the first
configuration.

On a 135M model accuracy is near chance: read the properties (ties, order consistency, calibration
error, option mass, cost), not the accuracy.

usage: python -m tools.quality.quality [--model PATH] [--port N] [--questions FILE] [--orders K] [--limit N]
                                       [--configs NAME,...] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path
from statistics import median
from typing import Any

import httpx

from tools.common.serving import add_server_arguments, served_model, target
from vllm.entrypoints.generate.decisions.calibration import maths, question_file

CONFIGS = {
    "bf16 logits, off": {"backend_options": {"precision": "model"}, "debias": "off"},
    "fp32 logits, off": {"backend_options": {"precision": "float32"}, "debias": "off"},
    "fp32 logits, rotate": {
        "backend_options": {"precision": "float32"},
        "debias": "rotate",
    },
    "fp32 logits, rotate:6": {
        "backend_options": {"precision": "float32"},
        "debias": "rotate:6",
    },
}


async def ask(
    http: httpx.AsyncClient,
    model: str,
    state: str,
    question: dict[str, Any],
    extra: dict[str, Any],
) -> dict[str, Any]:
    body = {
        "model": model,
        "state": state,
        "questions": {"q": question},
        "extra": {**extra, "detail": "full"},
    }
    response = await http.post("/v1/systemone", json=body)
    response.raise_for_status()
    answer = response.json()["answers"]["q"]
    return {
        "logits": answer["extra"]["backend"]["option_logits"],
        "audit": answer["extra"]["audit"],
    }


def shuffled(question: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    items = list(question["criteria"].items())
    rng.shuffle(items)
    return {**question, "criteria": dict(items)}


def softmax(scores: list[float]) -> list[float]:
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    return [w / sum(weights) for w in weights]


async def run_configs(
    url: str,
    items: list[question_file.LabelledQuestion],
    configs: dict[str, dict[str, Any]],
    orders: int,
    concurrency: int,
) -> dict[str, dict[str, Any]]:
    """Every question (and its reordered variants) under every configuration. Per question the
    configurations go one after another in a shuffled order, so each meets the prefix cache as warm
    as the others; a configuration's time is the sum of its own requests' times."""
    gate = asyncio.Semaphore(concurrency)
    rng = random.Random(0)
    variants = {
        i: [shuffled(q.raw, rng) for _ in range(orders)]
        for i, q in enumerate(items)
        if q.question.qtype.name == "choice"
    }
    spent = dict.fromkeys(configs, 0.0)
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        model = await served_model(http)

        async def under(index: int, extra: dict[str, Any]) -> dict[str, Any]:
            item = items[index]
            main = await ask(http, model, item.state, item.raw, extra)
            others = [
                await ask(http, model, item.state, v, extra)
                for v in variants.get(index, [])
            ]
            keys = [o.key for o in item.question.options]
            scores = [
                main["logits"][k] if main["logits"][k] is not None else -math.inf
                for k in keys
            ]
            tops = [
                max(
                    r["logits"],
                    key=lambda k: (
                        r["logits"][k] if r["logits"][k] is not None else -math.inf
                    ),
                )
                for r in [main, *others]
            ]
            return {
                "scores": scores,
                "audit": main["audit"],
                "consistent": len(set(tops)) == 1 if others else None,
            }

        async def one(index: int) -> dict[str, dict[str, Any]]:
            names = list(configs)
            random.Random(index).shuffle(names)
            rows = {}
            async with gate:
                for name in names:
                    started = time.perf_counter()
                    rows[name] = await under(index, configs[name])
                    spent[name] += time.perf_counter() - started
            return rows

        rows = await asyncio.gather(*(one(i) for i in range(len(items))))
    decisions = len(items) + sum(len(v) for v in variants.values())
    return {
        name: {
            "rows": [r[name] for r in rows],
            "seconds_per_decision": spent[name] / decisions,
        }
        for name in configs
    }


def metrics(
    items: list[question_file.LabelledQuestion], rows: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per question type and overall (``all``)."""
    kinds = [q.question.qtype.name for q in items]
    scores = [r["scores"] for r in rows]
    correct = [q.correct for q in items]
    groups = [q.group for q in items]
    labelled = maths.Labelled(scores, correct, groups)
    one_t = maths.cross_validated_probabilities(labelled)
    per_type: list[list[float]] = [[] for _ in items]
    for kind in set(kinds):
        chosen = [i for i, k in enumerate(kinds) if k == kind]
        fitted = maths.cross_validated_probabilities(labelled.rows(chosen))
        for i, p in zip(chosen, fitted, strict=True):
            per_type[i] = p
    out = {}
    for kind in ["all", *sorted(set(kinds))]:
        chosen = [i for i, k in enumerate(kinds) if kind in ("all", k)]
        raw = [softmax(scores[i]) for i in chosen]
        hits = [
            max(range(len(p)), key=p.__getitem__) == correct[i]
            for p, i in zip(raw, chosen, strict=True)
        ]
        position = Counter((kinds[i], correct[i]) for i in chosen)
        majority = sum(
            max(c for (k, _), c in position.items() if k == t)
            for t in {kinds[i] for i in chosen}
        )
        group = [groups[i] for i in chosen]

        def calibration(
            probabilities: list[list[float]],
            hits: list[bool] = hits,
            group: list[str] = group,
        ):
            top = [max(p) for p in probabilities]
            return maths.ece(top, hits), maths.bootstrap_interval(
                top, hits, group, resamples=300
            )

        consistent = [
            rows[i]["consistent"] for i in chosen if rows[i]["consistent"] is not None
        ]
        masses = [rows[i]["audit"].get("option_mass") for i in chosen]
        out[kind] = {
            "questions": len(chosen),
            "accuracy": sum(hits) / len(chosen),
            "majority_baseline": majority / len(chosen),
            "log_loss": -sum(
                math.log(max(p[correct[i]], 1e-300))
                for p, i in zip(raw, chosen, strict=True)
            )
            / len(chosen),
            "brier": sum(
                sum((x - (j == correct[i])) ** 2 for j, x in enumerate(p))
                for p, i in zip(raw, chosen, strict=True)
            )
            / len(chosen),
            "ece_raw": calibration(raw),
            "ece_one_t": calibration([one_t[i] for i in chosen]),
            "ece_per_type_t": calibration([per_type[i] for i in chosen]),
            "top_ties": sum(
                sorted(scores[i])[-1] == sorted(scores[i])[-2] for i in chosen
            )
            / len(chosen),
            "order_consistency": sum(consistent) / len(consistent)
            if consistent
            else None,
            "option_mass": median(m for m in masses if m is not None)
            if any(m is not None for m in masses)
            else None,
        }
    return out


async def cost(
    url: str, configs: dict[str, dict[str, Any]], rounds: int
) -> dict[str, float]:
    """Seconds per decision at a ~1,000-token input, every request a new input, configurations interleaved."""
    rng = random.Random(1)
    words = [
        "account",
        "payment",
        "order",
        "refund",
        "delivery",
        "login",
        "error",
        "screen",
        "invoice",
        "card",
        "password",
    ]
    question = {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {
            t: None
            for t in ("billing", "technical", "account", "sales", "shipping", "other")
        },
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        model = await served_model(http)
        for r in range(rounds):
            names = list(configs)
            rng.shuffle(names)
            for name in names:
                state = f"Ticket {r}-{name}: " + " ".join(
                    rng.choice(words) for _ in range(750)
                )
                started = time.perf_counter()
                await ask(http, model, state, question, configs[name])
                times[name].append(time.perf_counter() - started)
    return {name: median(values) for name, values in times.items()}


def table(results: dict[str, Any]) -> str:
    lines = []
    for name, per_kind in results["configs"].items():
        lines.append(f"\n{name}  ({per_kind['seconds_per_decision']:.3f} s/decision)")
        lines.append(
            f"{'type':8} {'n':>4} {'acc':>6} {'major':>6} {'logloss':>8} {'brier':>6} {'ECE raw':>16} "
            f"{'ECE one T':>16} {'ECE per-type T':>16} {'ties':>6} {'order':>6} {'mass':>6}"
        )
        for kind, m in per_kind["metrics"].items():

            def e(v: Any) -> str:
                return f"{v[0]:.3f} [{v[1][0]:.2f},{v[1][1]:.2f}]"

            order = (
                "-"
                if m["order_consistency"] is None
                else f"{m['order_consistency']:.2f}"
            )
            mass = "-" if m["option_mass"] is None else f"{m['option_mass']:.2f}"
            lines.append(
                f"{kind:8} {m['questions']:>4} {m['accuracy']:>6.3f} {m['majority_baseline']:>6.3f} "
                f"{m['log_loss']:>8.3f} {m['brier']:>6.3f} {e(m['ece_raw']):>16} {e(m['ece_one_t']):>16} "
                f"{e(m['ece_per_type_t']):>16} {m['top_ties']:>6.2f} {order:>6} {mass:>6}"
            )
    base = next(iter(results["cost"].values()))
    lines.append(
        "\ncost at a ~1,000-token input (median s/decision, ratio to the first configuration):"
    )
    lines += [
        f"  {name:24} {s:.3f} s  {s / base:.2f}x" for name, s in results["cost"].items()
    ]
    return "\n".join(lines)


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    items = list(question_file.load(args.questions).questions)
    if args.limit:
        items = random.Random(2).sample(items, min(args.limit, len(items)))
    configs = (
        {name: CONFIGS[name] for name in args.configs.split(",")}
        if args.configs
        else CONFIGS
    )
    results: dict[str, Any] = {
        "questions": args.questions,
        "orders": args.orders,
        "configs": {},
    }
    runs = await run_configs(url, items, configs, args.orders, args.concurrency)
    for name, run in runs.items():
        results["configs"][name] = {
            "seconds_per_decision": run["seconds_per_decision"],
            "metrics": metrics(items, run["rows"]),
        }
    print("measured the labelled questions", file=sys.stderr)
    results["cost"] = await cost(url, configs, args.cost_rounds)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # The "bf16 logits" rows read a bf16 model's own logits: the server is bf16 here whatever the CPU.
    add_server_arguments(parser, "nothing (not used here)", dtype="bfloat16")
    parser.add_argument(
        "--questions",
        default=question_file.BUNDLED,
        help="a labelled file (calibration format)",
    )
    parser.add_argument(
        "--orders", type=int, default=3, help="random option orders per choice question"
    )
    parser.add_argument(
        "--limit", type=int, help="a seeded sample of this many questions"
    )
    parser.add_argument(
        "--configs", help="a comma-separated subset of: " + ", ".join(CONFIGS)
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--cost-rounds", type=int, default=12)
    parser.add_argument("--json", default="quality-results.json")
    args = parser.parse_args()
    # No startup calibration: the figures come from the raw option logits, and the tool fits its own T.
    with target(args, 8191, {"VLLM_TYPED_DECISIONS_CALIBRATION": "off"}) as (url, _):
        results = asyncio.run(measure(url, args))
    results.update(model=args.model, date=time.strftime("%Y-%m-%d"))
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(f"(wrote {args.json})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
