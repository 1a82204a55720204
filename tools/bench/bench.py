"""Benchmark the decision path against the bare engine, side by side in one run.

Starts its own `vllm serve` (decisions on, a fresh calibration folder) unless --port targets a running
one, then measures, with seeded inputs:

- overhead: a one-question decision (exact read) against the same one-token read of the same prompt
  tokens and label ids through vLLM's /v1/completions, interleaved request by request (alternating
  which goes first), every state distinct so the prefix cache helps neither side; p50/p95 and their
  ratio, and the CPU time each request cost the API-server process and the engine processes;
- shared input: 16 questions about one state (about 1,000 and 4,000 tokens) in one request, against the
  same questions as 16 single-question requests sent one after another; time per decision, the ratio,
  and the share of input tokens served from the prefix cache; then where the time goes: the state's
  first prefill, one more question on the cached state as its own request, and per question when 15
  share a request on the cached state, which bound the ratio any server could reach here;
- reads (--reads): what each way of reading costs per decision in a 16-question request over a fresh
  ~1,000-token state, interleaved round by round in a shuffled order: ``off`` (one read in the order
  sent, the baseline), the server's default, ``rotate:1`` with the content-free prior (its neutral reads
  cached by a first request: what a server asking the same questions about many inputs pays), the same
  with a cold cache (each round's questions worded anew), and ``rotate`` (two readings); the ratio to
  ``off`` and the prompt tokens each computed;
- concurrency: decisions per second with 1, 4 and 8 requests in flight;
- board speed: one question per request, one at a time, p50/p95 of caller wall time and the speed score
  100 - 20*log10(s / 0.1 s) averaged over p50 and p95 (unadjusted);
- startup (own server only): seconds from /health up to the first answered decision, first without a
  saved calibration, then with it; and the calibration's cost against a plain read's: its seconds, the
  engine reads before the first answer, and how many plain one-token reads of a calibration-sized prompt
  (one at a time, same server) its seconds would buy, a figure that travels between machines;
- bulk (--bulk-lines N, own server only): the same N lines through `vllm run-batch` and through the
  online server at its best concurrency (tools/bench/bench_bulk.py, which also runs alone);
- adapter (--adapter, own server only, alone): what reading through a LoRA adapter costs against the base
  model on one server (`--enable-lora`, a random rank-8 q_proj/v_proj adapter built over the model by
  tools/env/build_lora_adapter.py, the temperature configured so neither calibrates, and the self-check
  threshold at 0, since the random adapter's answers are noise): one-question
  decisions and 16-question requests (~800-word states), base and adapter interleaved request by
  request (alternating which goes first), every state distinct; p50 per decision and the ratio.

This machine is shared and noisy: only the ratios measured within one run are results.

usage: python -m tools.bench.bench [--model PATH] [--port N [--server-pid PID]] [--quick] [--bulk-lines N]
                                   [--reads | --only-reads | --adapter] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import httpx
import psutil

from tools.bench import bench_bulk
from tools.common.serving import (
    add_server_arguments,
    api_and_engine,
    serve,
    startup_seconds,
    stop,
)
from tools.common.tokenizer_host import TokenizerOnlyHost
from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import (
    AnswerSlot,
    AnswerSlotPlacer,
)
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import messages  # noqa: E402
from vllm.entrypoints.generate.decisions.decide.questions import NOUL, NoulQuestion  # noqa: E402

# bench_bulk's sixteen words, then a few more for the longer inputs.
WORDS = [
    *bench_bulk.WORDS,
    "priority",
    "escalation",
    "warehouse",
    "region",
    "weekly",
    "monthly",
    "report",
    "status",
]
QUESTIONS = [f"Does the text mention {w}?" for w in WORDS[:16]]
# The reads phase's rows: the request's extra block for each.
READS = {
    "off": {"debias": "off", "prior": "off"},
    "default": {},
    "content-free, cached": {"debias": "rotate:1", "prior": "content-free"},
    "content-free, cold": {"debias": "rotate:1", "prior": "content-free"},
    "rotate (two readings)": {"debias": "rotate", "prior": "off"},
}


def state_of(rng: random.Random, words: int) -> str:
    return " ".join(
        rng.choice(WORDS) + ("." if i % 12 == 11 else "") for i in range(words)
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def speed_score(seconds: float) -> float:
    return 100 - 20 * math.log10(seconds / 0.1)


def cpu_seconds(process: psutil.Process) -> float:
    return sum(process.cpu_times()[:2])  # user + system


class Bench:
    def __init__(
        self, url: str, model: str, tokenizer: Any, server_pid: int | None = None
    ) -> None:
        self.url, self.model = url, model
        self.client = httpx.AsyncClient(base_url=url, timeout=600)
        self.host = TokenizerOnlyHost(tokenizer)
        self.placer = AnswerSlotPlacer(self.host)
        self.server_pid = server_pid

    async def metered(self, call: Any) -> tuple[Any, float, float]:
        """``call``'s result, and the API-server and engine CPU seconds spent while it ran."""
        api, engine = api_and_engine(self.server_pid, cpu_seconds)
        result = await call
        api_after, engine_after = api_and_engine(self.server_pid, cpu_seconds)
        return result, api_after - api, engine_after - engine

    async def decide(
        self,
        state: str,
        questions: list[str],
        extra: dict[str, Any] | None = None,
        model: str | None = None,
        **backend_options: Any,
    ) -> tuple[float, dict]:
        body = {
            "model": model or self.model,
            "input": state,
            "extra": {"backend_options": backend_options, **(extra or {})},
            "questions": [{"type": "predicate", "instructions": q} for q in questions],
        }
        started = time.perf_counter()
        response = await self.client.post("/v1/decisions", json=body)
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        return elapsed, response.json()

    async def slot(self, state: str, question: str) -> AnswerSlot:
        """The prompt tokens and label ids of a yes/no decision's read, rendered here in full."""
        compiled = NOUL.compile(NoulQuestion(instructions=question))
        return self.placer.place(
            await self.host.render_chat(messages(state, compiled, ["A", "B"])),
            ["A", "B"],
        )

    async def bare_read(self, state: str, question: str) -> tuple[float, int]:
        """The same prompt tokens and label ids as the decision's read, through /v1/completions."""
        slot = await self.slot(state, question)
        body = {
            "model": self.model,
            "prompt": slot.prompt_ids,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": 2,
            "logprob_token_ids": slot.label_ids,
        }
        started = time.perf_counter()
        response = await self.client.post("/v1/completions", json=body)
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        return elapsed, len(slot.prompt_ids)

    async def overhead(self, rng: random.Random, rounds: int) -> dict[str, Any]:
        ours, bare, mismatched = [], [], 0
        cpu: dict[str, list[float]] = {
            "ours_api": [],
            "ours_engine": [],
            "bare_api": [],
            "bare_engine": [],
        }
        for i in range(rounds):
            pair = [
                state_of(rng, 150),
                state_of(rng, 150),
            ]  # distinct states: no cache for either side
            for side in ("bare", "ours") if i % 2 == 0 else ("ours", "bare"):
                if side == "bare":
                    (t_bare, _), api, engine = await self.metered(
                        self.bare_read(pair[0], QUESTIONS[0])
                    )
                    bare.append(t_bare)
                else:
                    (t_ours, body), api, engine = await self.metered(
                        self.decide(pair[1], [QUESTIONS[0]], logprobs="exact")
                    )
                    ours.append(t_ours)
                cpu[f"{side}_api"].append(api)
                cpu[f"{side}_engine"].append(engine)
            expected = len((await self.slot(pair[1], QUESTIONS[0])).prompt_ids)
            mismatched += (
                body["answers"][0]["extra"]["audit"]["input_tokens"] != expected
            )
        return {
            "rounds": rounds,
            "decision_p50_s": pct(ours, 0.5),
            "decision_p95_s": pct(ours, 0.95),
            "bare_p50_s": pct(bare, 0.5),
            "bare_p95_s": pct(bare, 0.95),
            "ratio_p50": pct(ours, 0.5) / pct(bare, 0.5),
            "ratio_p95": pct(ours, 0.95) / pct(bare, 0.95),
            "cpu_ms_per_request": {
                k: 1000 * sum(v) / len(v) for k, v in cpu.items()
            },  # ticks are 10 ms
            "prompt_length_mismatches": mismatched,
        }  # against rendering here in full

    async def shared_input(
        self, rng: random.Random, words: int, repeats: int
    ) -> dict[str, Any]:
        runs = [await self.shared_input_once(rng, words) for _ in range(repeats)]
        result = {key: median(run[key] for run in runs) for key in runs[0]}
        result["repeats"] = repeats
        return result

    async def shared_input_once(self, rng: random.Random, words: int) -> dict[str, Any]:
        n = len(QUESTIONS)
        # fresh states: both start uncached
        state_a, state_b = (
            state_of(rng, words),
            state_of(rng, words),
        )
        (t_one, body), api_one, _ = await self.metered(self.decide(state_a, QUESTIONS))
        usage = body["usage"]
        singles, single_in, single_cached, api_singles = [], 0, 0, 0.0
        for question in QUESTIONS:
            (elapsed, single), api, _ = await self.metered(
                self.decide(state_b, [question])
            )
            singles.append(elapsed)
            api_singles += api
            single_in += single["usage"]["input_tokens"]
            single_cached += single["usage"]["input_tokens_details"]["cached_tokens"]
        # Where the time goes: the same questions again on state_b, now cached, all in one request.
        t_cached_batch, _ = await self.decide(state_b, QUESTIONS[1:])
        first, later, shared_later = (
            singles[0],
            sum(singles[1:]) / (n - 1),
            t_cached_batch / (n - 1),
        )
        return {
            "state_tokens": usage["input_tokens"] // n,
            "questions": n,
            "one_request_s_per_decision": t_one / n,
            "single_requests_s_per_decision": sum(singles) / n,
            "ratio": sum(singles) / t_one,
            "one_request_cached_share": usage["input_tokens_details"]["cached_tokens"]
            / usage["input_tokens"],
            "single_requests_cached_share": single_cached / single_in,
            "api_cpu_ms_per_decision_one_request": 1000 * api_one / n,
            "api_cpu_ms_per_decision_single_requests": 1000 * api_singles / n,
            "first_prefill_s": first,
            "cached_question_own_request_s": later,
            "cached_question_in_shared_request_s": shared_later,
            "ratio_ceiling": (first + (n - 1) * later)
            / (first + (n - 1) * shared_later),
        }

    async def reads(
        self, rng: random.Random, words: int, rounds: int
    ) -> dict[str, Any]:
        """Each way of reading (READS) on fresh states, interleaved; seconds and prompt tokens per decision."""
        seconds: dict[str, list[float]] = {row: [] for row in READS}
        tokens = dict.fromkeys(READS, 0)
        modes: dict[str, set[str]] = {row: set() for row in READS}
        # the cache warmed
        await self.decide(state_of(rng, 50), QUESTIONS, READS["content-free, cached"])
        for round_ in range(rounds):
            order = list(READS)
            rng.shuffle(order)
            for row in order:
                # A cold row asks questions worded for this round only: their neutral reads are new.
                questions = (
                    [f"{q} (round {round_})" for q in QUESTIONS]
                    if row.endswith("cold")
                    else QUESTIONS
                )
                elapsed, body = await self.decide(
                    state_of(rng, words), questions, READS[row]
                )
                seconds[row].append(elapsed / len(questions))
                tokens[row] += (
                    body["usage"]["input_tokens"]
                    - body["usage"]["input_tokens_details"]["cached_tokens"]
                )
                modes[row] |= {
                    a["extra"]["audit"].get("prior", {}).get("mode", "off")
                    for a in body["answers"]
                }
        base = median(seconds["off"])
        return {
            row: {
                "s_per_decision": median(v),
                "ratio": median(v) / base,
                "modes": sorted(modes[row]),
                "computed_tokens_per_decision": tokens[row] / (rounds * len(QUESTIONS)),
            }
            for row, v in seconds.items()
        } | {"rounds": rounds, "words": words}

    async def adapter(
        self, rng: random.Random, adapter: str, rounds: int
    ) -> dict[str, Any]:
        """Seconds per decision through ``adapter`` and through the base model, interleaved, fresh states."""
        rows = {}
        for name, questions, words, count in (
            ("one question", QUESTIONS[:1], 150, rounds),
            ("16 questions, one request", QUESTIONS, 800, max(rounds // 4, 3)),
        ):
            seconds: dict[str, list[float]] = {"base": [], "adapter": []}
            for i in range(count):
                for side in ("base", "adapter") if i % 2 == 0 else ("adapter", "base"):
                    elapsed, _ = await self.decide(
                        state_of(rng, words),
                        questions,
                        model=adapter if side == "adapter" else None,
                    )
                    seconds[side].append(elapsed / len(questions))
            base, through = median(seconds["base"]), median(seconds["adapter"])
            rows[name] = {
                "rounds": count,
                "base_s": base,
                "adapter_s": through,
                "ratio": through / base,
            }
        return rows

    async def concurrency(
        self, rng: random.Random, in_flight: int, total: int
    ) -> dict[str, Any]:
        states = [state_of(rng, 150) for _ in range(total)]
        queue: asyncio.Queue[str] = asyncio.Queue()
        for s in states:
            queue.put_nowait(s)

        async def worker() -> None:
            while not queue.empty():
                await self.decide(queue.get_nowait(), [QUESTIONS[1]])

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return {
            "in_flight": in_flight,
            "decisions": total,
            "per_second": total / (time.perf_counter() - started),
        }

    async def board(self, rng: random.Random, rounds: int) -> dict[str, Any]:
        times = [
            (await self.decide(state_of(rng, 120), [QUESTIONS[2]]))[0]
            for _ in range(rounds)
        ]
        p50, p95 = pct(times, 0.5), pct(times, 0.95)
        return {
            "rounds": rounds,
            "p50_s": p50,
            "p95_s": p95,
            "speed_score": (speed_score(p50) + speed_score(p95)) / 2,
        }


async def measure(
    url: str,
    model: str,
    tokenizer_path: str,
    quick: bool,
    server_pid: int | None,
    reads: str = "",
    adapter: str | None = None,
) -> dict[str, Any]:
    """Every phase; ``reads``: "" without the reads phase, "also" with it, "only" for it alone; with
    ``adapter``, the adapter phase alone."""
    from transformers import AutoTokenizer

    bench = Bench(url, model, AutoTokenizer.from_pretrained(tokenizer_path), server_pid)
    rng = random.Random(0)
    # first-request costs are not what we measure
    await bench.decide("warm-up", [QUESTIONS[0]])
    results: dict[str, Any] = {}
    if adapter is not None:
        probe = {
            "model": adapter,
            "input": "warm-up",
            "questions": [{"type": "predicate", "instructions": "?"}],
        }
        while (
            response := await bench.client.post("/v1/decisions", json=probe)
        ).status_code == 503:
            # its own startup check refused it
            if "retry-after" not in response.headers:
                raise SystemExit(f"the adapter serves no decisions: {response.text}")
            await asyncio.sleep(1)
        results["adapter"] = await bench.adapter(rng, adapter, 8 if quick else 24)
        await bench.client.aclose()
        return results
    if reads:
        results["reads"] = await bench.reads(rng, 800, 3 if quick else 8)
    if reads == "only":
        await bench.client.aclose()
        return results
    results["overhead"] = await bench.overhead(rng, 10 if quick else 40)
    results["shared_input"] = [
        await bench.shared_input(rng, words, 1 if quick else 3) for words in (800, 3400)
    ]
    results["concurrency"] = [
        await bench.concurrency(rng, n, 8 if quick else 24) for n in (1, 4, 8)
    ]
    results["board"] = await bench.board(rng, 10 if quick else 30)
    await bench.client.aclose()
    return results


async def calibration_cost(
    url: str, model: str, tokenizer_path: str, calibration_dir: str, rounds: int = 8
) -> dict[str, Any]:
    """What the startup calibration just made cost, in units that travel between machines: its seconds
    (from its saved record, waited for), the engine reads the server made before its first answer (the
    startup self-check's few and the first pass's; vllm:decision_engine_read_latency_seconds, phase
    startup) and once the full calibration is saved, and
    the p50 of a plain one-token read of a calibration-sized prompt (a ~20-word state, distinct each
    time) through /v1/completions, one at a time, on the same server right after."""
    from transformers import AutoTokenizer

    # before the first answer: the first pass's, where there is one
    reads = startup_reads(url)
    record = saved_calibration(calibration_dir)
    # it failed (T = 1.0): the startup line still says how long it took
    if record is None:
        return {"failed": "no successful calibration saved in " + calibration_dir}
    every = startup_reads(url)  # the full calibration's too
    bench = Bench(url, model, AutoTokenizer.from_pretrained(tokenizer_path))
    rng = random.Random(1)
    plain = [
        (await bench.bare_read(state_of(rng, 20), QUESTIONS[i % len(QUESTIONS)]))[0]
        for i in range(rounds)
    ]
    await bench.client.aclose()
    seconds, plain_s = float(record["seconds"]), pct(plain, 0.5)
    return {
        "calibration_s": seconds,
        "questions": record["questions"]["used"],
        "startup_engine_reads": reads,
        "calibration_engine_reads": every,
        "plain_read_p50_s": plain_s,
        "seconds_per_read": seconds / max(every, 1),
        "in_plain_reads": seconds / plain_s,
    }


def startup_reads(url: str) -> int:
    """The engine reads the server has made outside requests so far (self-check and calibration)."""
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("vllm:decision_engine_read_latency_seconds_count{")
            and 'phase="startup"' in line
        )
    )


def saved_calibration(
    calibration_dir: str, wait_s: float = 3600.0
) -> dict[str, Any] | None:
    """The full calibration's record once it is saved (after a first pass it comes minutes after the
    first answer); None when it failed or didn't come within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for f in sorted(Path(calibration_dir).glob("calibration-*.json")):
            record = json.loads(f.read_text())
            if "seconds" in record:
                return record
            if "failed" in record:
                return None
        time.sleep(1.0)
    return None


def reads_table(reads: dict[str, Any]) -> str:
    lines = [
        f"16 questions over a fresh ~{reads['words']}-word state, {reads['rounds']} rounds (median per decision):",
        "| read | s per decision | ratio to off | prompt tokens computed per decision | corrections applied |",
        "|---|---|---|---|---|",
    ]
    for row in READS:
        r = reads[row]
        lines.append(
            f"| {row} | {r['s_per_decision']:.3f} | {r['ratio']:.2f} | "
            f"{r['computed_tokens_per_decision']:.0f} | {', '.join(r['modes'])} |"
        )
    return "\n".join(lines)


def adapter_table(rows: dict[str, Any]) -> str:
    lines = [
        "| decisions | base model, s per decision (p50) | through the adapter | ratio |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {name} ({r['rounds']} rounds) | {r['base_s']:.3f} | {r['adapter_s']:.3f} | {r['ratio']:.2f} |"
        for name, r in rows.items()
    ]
    return "\n".join(lines)


def table(results: dict[str, Any]) -> str:
    if "adapter" in results:
        return adapter_table(results["adapter"])
    if "overhead" not in results:
        return reads_table(results["reads"])
    o = results["overhead"]
    lines = [
        "| measure | ours | baseline | ratio |",
        "|---|---|---|---|",
        f"| one question, p50 (s) | {o['decision_p50_s']:.3f} | {o['bare_p50_s']:.3f} /v1/completions | {o['ratio_p50']:.2f} |",
        f"| one question, p95 (s) | {o['decision_p95_s']:.3f} | {o['bare_p95_s']:.3f} /v1/completions | {o['ratio_p95']:.2f} |",
    ]
    lines.append(
        f"| one question: prompt tokens equal to rendering in full here | "
        f"{o['rounds'] - o['prompt_length_mismatches']}/{o['rounds']} | | |"
    )
    c = o["cpu_ms_per_request"]
    if c["ours_api"] or c["bare_api"]:
        lines += [
            (
                f"| one question: API-server CPU ms per request | {c['ours_api']:.1f} | {c['bare_api']:.1f} | "
                f"{c['ours_api'] / max(c['bare_api'], 1e-9):.2f} |"
            ),
            (
                f"| one question: engine CPU ms per request | {c['ours_engine']:.0f} | {c['bare_engine']:.0f} | "
                f"{c['ours_engine'] / max(c['bare_engine'], 1e-9):.2f} |"
            ),
        ]
    for s in results["shared_input"]:
        size = f"16 questions, ~{s['state_tokens']}-token prompt"
        lines += [
            (
                f"| {size}: s per decision | {s['one_request_s_per_decision']:.3f} "
                f"(one request, {s['one_request_cached_share']:.0%} cached) | {s['single_requests_s_per_decision']:.3f} "
                f"(16 requests, {s['single_requests_cached_share']:.0%} cached) | {s['ratio']:.1f}x cheaper |"
            ),
            (
                f"| {size}: API-server CPU ms per decision | {s['api_cpu_ms_per_decision_one_request']:.1f} | "
                f"{s['api_cpu_ms_per_decision_single_requests']:.1f} | |"
            ),
            (
                f"| {size}: where the time goes (s) | first prefill {s['first_prefill_s']:.3f}; a cached question "
                f"{s['cached_question_in_shared_request_s']:.3f} sharing a request | "
                f"{s['cached_question_own_request_s']:.3f} as its own request | ceiling {s['ratio_ceiling']:.1f}x |"
            ),
        ]
    base = results["concurrency"][0]["per_second"]
    for c in results["concurrency"]:
        lines.append(
            f"| decisions/s at {c['in_flight']} in flight | {c['per_second']:.1f} | {base:.1f} at 1 | {c['per_second'] / base:.2f} |"
        )
    b = results["board"]
    lines.append(
        f"| board: p50 / p95 caller time (s), speed score | {b['p50_s']:.3f} / {b['p95_s']:.3f}, {b['speed_score']:.1f} | | |"
    )
    if "startup" in results:
        st = results["startup"]
        lines.append(
            f"| startup: /health to first decision (s) | {st['with_saved_calibration_s']:.1f} with a saved calibration "
            f"| {st['calibrating_s']:.1f} calibrating | |"
        )
        if "calibration_s" in st.get("calibration", {}):
            c = st["calibration"]
            lines.append(
                f"| startup calibration: {c['questions']} questions, {c['startup_engine_reads']} engine reads before "
                f"the first answer, {c['calibration_engine_reads']} in all | {c['calibration_s']:.0f} s "
                f"({c['seconds_per_read'] * 1000:.0f} ms a read) | "
                f"plain read p50 {c['plain_read_p50_s'] * 1000:.0f} ms | {c['in_plain_reads']:.0f} plain reads |"
            )
    if "reads" in results:
        lines += ["", reads_table(results["reads"])]
    return "\n".join(lines)


def adapter_phase(args: argparse.Namespace) -> dict[str, Any]:
    """A server with a random adapter built over the model beside it; the adapter phase against it."""
    from env.build_lora_adapter import build

    port = 8190
    with tempfile.TemporaryDirectory() as folder:
        adapter = build(Path(args.model), Path(folder) / "adapter")
        lora = [
            "--enable-lora",
            "--max-lora-rank",
            "8",
            "--lora-modules",
            f"adapter={adapter}",
        ]
        # Cost only: no calibration, and no self-check refusal (a random adapter wrecks the answers).
        env = {
            "VLLM_TYPED_DECISIONS_TEMPERATURE": "1",
            "VLLM_TYPED_DECISIONS_MIN_OPTION_MASS": "0",
        }
        process = serve(
            args.model, port, folder, Path(folder) / "serve.log", env, args.dtype, lora
        )
        try:
            startup_seconds(f"http://127.0.0.1:{port}", process)
            return asyncio.run(
                measure(
                    f"http://127.0.0.1:{port}",
                    args.model,
                    args.model,
                    args.quick,
                    process.pid,
                    adapter="adapter",
                )
            )
        finally:
            stop(process)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_server_arguments(parser, "the CPU columns")
    parser.add_argument(
        "--quick", action="store_true", help="fewer rounds (a smoke run, not a result)"
    )
    parser.add_argument("--json", default="bench-results.json")
    parser.add_argument(
        "--bulk-lines",
        type=int,
        default=0,
        help="add the bulk phase with this many batch lines",
    )
    parser.add_argument(
        "--reads",
        action="store_const",
        const="also",
        default="",
        help="add the reads phase",
    )
    parser.add_argument(
        "--only-reads",
        dest="reads",
        action="store_const",
        const="only",
        help="the reads phase alone",
    )
    parser.add_argument(
        "--adapter", action="store_true", help="the adapter phase alone (own server)"
    )
    args = parser.parse_args()
    results: dict[str, Any] = {"model": args.model, "date": time.strftime("%Y-%m-%d")}
    if args.adapter:
        results.update(adapter_phase(args))
    elif args.port:
        url = f"http://127.0.0.1:{args.port}"
        served = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        results.update(
            asyncio.run(
                measure(
                    url, served, args.model, args.quick, args.server_pid, args.reads
                )
            )
        )
    else:
        port = 8190
        url = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryDirectory() as calibration_dir:
            logs = Path(calibration_dir)
            process = serve(
                args.model, port, calibration_dir, logs / "first.log", dtype=args.dtype
            )
            try:
                calibrating = startup_seconds(url, process)
                cost = asyncio.run(
                    calibration_cost(url, "m", args.model, calibration_dir)
                )
            finally:
                stop(process)
            process = serve(
                args.model, port, calibration_dir, logs / "second.log", dtype=args.dtype
            )
            try:
                saved = startup_seconds(url, process)
                results["startup"] = {
                    "calibrating_s": calibrating,
                    "with_saved_calibration_s": saved,
                    "calibration": cost,
                }
                results.update(
                    asyncio.run(
                        measure(
                            url,
                            args.model,
                            args.model,
                            args.quick,
                            process.pid,
                            args.reads,
                        )
                    )
                )
            finally:
                stop(process)
    if args.bulk_lines and not args.port:
        results["bulk"] = bench_bulk.measure(args.model, args.bulk_lines, args.dtype)
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    if "bulk" in results:
        print(bench_bulk.table(results["bulk"]))
    print(f"(wrote {args.json})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
