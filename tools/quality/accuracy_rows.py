"""What each row of tools/quality/accuracy.py asks, and how its answer becomes one score per option: ours on
/v1/systemone per read (``OURS``), vLLM's constrained generation, chain of thought, a user's letter read on
/v1/completions, upstream vLLM's /v1/systemone. The rows and the figures are described in accuracy.py's
docstring."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from tools.quality.accuracy_figures import Reading
from tools.quality.letter_read import (
    MASS_FLOOR,
    TOP_LOGPROBS,
    letter_prompt,
    letter_scores,
    option_texts,
    plain_keys,
)
from vllm.entrypoints.generate.decisions.calibration import question_file
from vllm.entrypoints.generate.decisions.decide.questions import SCORE


# The rows ours answers: the request's extra block besides "detail".
def extra(
    prior: str, labels: str = "letters", debias: str = "rotate:1"
) -> dict[str, Any]:
    return {"prior": prior, "debias": debias, "backend_options": {"labels": labels}}


OURS = {
    **{
        mode: extra(mode)
        for mode in ("off", "content-free", "fitted", "content-free+fitted")
    },
    **{
        "words" + ("" if m == "off" else f"+{m}"): extra(m, "words")
        for m in ("off", "content-free", "fitted")
    },
    "default": {},
    "rotate": extra("off", debias="rotate"),
}
ROWS = [*OURS, "batch", "generation", "reasoning", "letters", "upstream"]
# The reasoning row's budget for its thinking: long enough for a few sentences, bounded in cost.
REASONING_TOKENS = 256


class RowRefused(Exception):
    """A request the server answered with an error status; the message is its body's gist."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


# --- the rows' requests -----------------------------------------------------------------------


def error_message(response: httpx.Response) -> str:
    """The gist of an error body, whichever wire shaped it."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        error = error.get("message", error)
    # FastAPI's validation errors
    if isinstance(body, dict) and isinstance(body.get("detail"), list):
        error = "; ".join(
            f"{'.'.join(map(str, e.get('loc', [])))}: {e.get('msg')}"
            for e in body["detail"]
        )
    return str(error)[:300]


async def post(
    http: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    response = await http.post(path, json=body)
    if response.status_code != 200:
        raise RowRefused(response.status_code, error_message(response))
    return response.json()


def served_scores(answer: dict[str, Any], keys: Sequence[str]) -> list[float]:
    """An answer's scores in option order, whose softmax over its T is what it served: the corrected
    ones when a correction applied, and where the operator's labels gave its question a map of its own
    (``audit.question_map``, or ``audit.examples`` where it was asked with in-context examples: served
    ``softmax(scores / T + bias)``) each plus T times its bias."""
    audit = answer["extra"]["audit"]
    prior = audit.get("prior")
    adjusted = prior.get("adjusted_logits") if isinstance(prior, dict) else None
    logits = adjusted or answer["extra"]["backend"]["option_logits"]
    scores = [-math.inf if logits.get(k) is None else float(logits[k]) for k in keys]
    question_map = audit.get("question_map") or audit.get("examples")
    if not isinstance(question_map, dict):
        return scores
    temperature = float(audit.get("calibration_temperature") or 1.0)
    bias = question_map["bias"]
    return [s + temperature * float(bias[k]) for s, k in zip(scores, keys, strict=True)]


def abstained(answer: dict[str, Any]) -> bool | None:
    """Whether the answer abstained (``extra.abstention``), None where the server said nothing."""
    said = answer["extra"].get("abstention")
    return bool(said["abstain"]) if isinstance(said, dict) else None


async def ask_ours(
    http: httpx.AsyncClient,
    item: question_file.LabelledQuestion,
    extra: dict[str, Any],
    model: str,
) -> Reading:
    body = {
        "model": model,
        "state": item.state,
        "questions": {"q": item.raw},
        "extra": {"detail": "full", **extra},
    }
    answer = (await post(http, "/v1/systemone", body))["answers"]["q"]
    keys = [option.key for option in item.question.options]
    temperature = answer["extra"]["audit"].get("calibration_temperature") or 1.0
    return Reading(
        served_scores(answer, keys), float(temperature), abstained=abstained(answer)
    )


def chat_prompt(item: question_file.LabelledQuestion, think: bool = False) -> str:
    """The question in plain words, as a user would ask it in a chat; with ``think``, asking for a
    few sentences of reasoning before a last line ``Answer: <key>`` (asked to think step by step,
    Qwen2.5-Coder-0.5B answers at once; asked to explain, quoting the input, it reasons first)."""
    question = item.question
    lines = [f"Input:\n{item.state}", ""]
    if question.instructions:
        lines.append(f"Question: {question.instructions}")
    lines.append("Levels, lowest first:" if question.qtype is SCORE else "Options:")
    lines += [f"- {text}" for text in option_texts(question)]
    keys = ", ".join(plain_keys(question))
    if think:
        lines.append(
            "First explain your reasoning in two or three sentences, quoting the input. Then "
            f"write a last line 'Answer: <one of: {keys}>'."
        )
    else:
        lines.append(f"Answer with one of: {keys}")
    return "\n".join(lines)


def generation_scores(
    reply: str, token_logprobs: Sequence[float], keys: Sequence[str]
) -> list[float]:
    """Log-probabilities for a generated key: its own from its tokens, the rest shared equally."""
    if reply not in keys:
        raise RowRefused(200, f"generated {reply!r}, not one of the options")
    chosen = math.exp(sum(token_logprobs))
    rest = max(1.0 - chosen, MASS_FLOOR) / max(len(keys) - 1, 1)
    return [
        math.log(max(chosen, MASS_FLOOR)) if key == reply else math.log(rest)
        for key in keys
    ]


def generated(reply: dict[str, Any], keys: Sequence[str]) -> Reading:
    """A chat completion restricted to the keys, scored by its generated key's tokens."""
    choice = reply["choices"][0]
    tokens = (choice.get("logprobs") or {}).get("content") or []
    return Reading(
        generation_scores(
            (choice["message"]["content"] or "").strip(),
            [t["logprob"] for t in tokens],
            keys,
        )
    )


async def ask_generation(
    http: httpx.AsyncClient, item: question_file.LabelledQuestion, model: str
) -> Reading:
    keys = plain_keys(item.question)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": chat_prompt(item)}],
        "temperature": 0,
        # A token is at least one character; one more for the end of text.
        "max_tokens": max(len(k) for k in keys) + 1,
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
        "structured_outputs": {"choice": keys},
    }
    return generated(await post(http, "/v1/chat/completions", body), keys)


async def ask_reasoning(
    http: httpx.AsyncClient, item: question_file.LabelledQuestion, model: str
) -> Reading:
    """Chain of thought, then the answer read as the generation row reads it: the model writes its
    reasoning freely (greedy, up to REASONING_TOKENS, stopped at ``Answer:``), then the same chat,
    continued after the reasoning and ``Answer:``, is restricted to the keys (each after a space)."""
    keys = plain_keys(item.question)
    user = {"role": "user", "content": chat_prompt(item, think=True)}
    thought = await post(
        http,
        "/v1/chat/completions",
        {
            "model": model,
            "messages": [user],
            "temperature": 0,
            "max_tokens": REASONING_TOKENS,
            "stop": ["Answer:"],
        },
    )
    reasoning = (thought["choices"][0]["message"]["content"] or "").rstrip()
    body = {
        "model": model,
        "messages": [
            user,
            {"role": "assistant", "content": f"{reasoning}\nAnswer:"},
        ],
        "add_generation_prompt": False,
        "continue_final_message": True,
        "temperature": 0,
        "max_tokens": max(len(k) for k in keys) + 2,
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
        "structured_outputs": {"choice": [f" {k}" for k in keys]},
    }
    return generated(await post(http, "/v1/chat/completions", body), keys)


async def ask_letters(
    http: httpx.AsyncClient,
    item: question_file.LabelledQuestion,
    model: str,
    model_path: str,
) -> Reading:
    body = {
        "model": model,
        "prompt": letter_prompt(item, model_path),
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": TOP_LOGPROBS,
    }
    choice = (await post(http, "/v1/completions", body))["choices"][0]
    top = choice["logprobs"]["top_logprobs"][0]
    return Reading(letter_scores(top, len(item.question.options)))


async def ask_upstream(
    http: httpx.AsyncClient, item: question_file.LabelledQuestion, model: str
) -> Reading:
    body = {"model": model, "state": item.state, "questions": {"q": item.raw}}
    probabilities = (await post(http, "/v1/systemone", body))["answers"]["q"][
        "probabilities"
    ]
    return Reading(
        [
            math.log(max(float(probabilities[k]), 1e-300))
            for k in plain_keys(item.question)
        ]
    )


@dataclass
class Servers:
    """The clients the rows ask through, the model names their servers serve, and the served model's
    folder (whose chat template the letters row renders with)."""

    ours: httpx.AsyncClient
    model: str
    model_path: str = ""
    upstream: httpx.AsyncClient | None = None
    upstream_model: str = ""

    async def ask(self, row: str, item: question_file.LabelledQuestion) -> Reading:
        if row in OURS:
            return await ask_ours(self.ours, item, OURS[row], self.model)
        if row == "generation":
            return await ask_generation(self.ours, item, self.model)
        if row == "reasoning":
            return await ask_reasoning(self.ours, item, self.model)
        if row == "letters":
            return await ask_letters(self.ours, item, self.model, self.model_path)
        if row == "upstream" and self.upstream is not None:
            return await ask_upstream(self.upstream, item, self.upstream_model)
        raise ValueError(f"no requests for row {row!r}")
