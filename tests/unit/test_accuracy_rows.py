"""How tools/quality/accuracy.py reads our answers, without a server: scores whose softmax over the
answer's T is what the server served, also where an operator's labels gave the question a map of its
own; the abstention figures an operator's precision adds; and the two requests of the reasoning
row."""

from __future__ import annotations

import argparse
import json
import math

import httpx
import pytest

from tools.quality.accuracy import chosen_rows
from tools.quality.accuracy_figures import Reading, metrics
from tools.quality.accuracy_rows import (
    REASONING_TOKENS,
    abstained,
    ask_reasoning,
    served_scores,
)
from vllm.entrypoints.generate.decisions.calibration import question_file
from vllm.entrypoints.generate.decisions.calibration.in_force import QuestionMap
from vllm.entrypoints.generate.decisions.decide.scoring import softmax

KEYS = ['"a"', '"b"', '"c"']
LOGITS = {'"a"': -0.4, '"b"': -1.6, '"c"': -2.3}
FIGURES = {
    "labels": 20,
    "log_loss": 0.8,
    "accuracy": 0.7,
    "type_log_loss": 1.0,
    "type_accuracy": 0.6,
    "gain": [0.05, 0.3],
}


def answer(audit: dict, abstention: dict | None = None) -> dict:
    extra = {"backend": {"option_logits": LOGITS}, "audit": audit}
    if abstention is not None:
        extra["abstention"] = abstention
    return {"extra": extra}


def test_plain_answers_are_their_logits_at_their_t():
    scores = served_scores(answer({"calibration_temperature": 2.0}), KEYS)
    assert scores == [LOGITS[k] for k in KEYS]


@pytest.mark.parametrize("block", ["question_map", "examples"])
def test_a_question_map_is_served_as_the_server_computes_it(block):
    """The server serves a mapped question softmax(scale * s + bias), saying T = 1 / scale and the
    bias in the audit (``examples`` where it was asked with in-context examples)."""
    question_map = QuestionMap(scale=1.7, bias=[0.9, -0.2, -0.7], **FIGURES)
    served = question_map.probabilities([LOGITS[k] for k in KEYS])
    temperature = 1 / question_map.scale
    audit = question_map.audit(KEYS).model_dump()
    read = answer({"calibration_temperature": temperature, block: audit})
    assert softmax(served_scores(read, KEYS), temperature) == pytest.approx(served)
    # without the bias the read would be another answer: c, not a, is the map's second choice
    plain = softmax([LOGITS[k] for k in KEYS], temperature)
    assert plain != pytest.approx(served, abs=0.01)


def test_abstention_figures_where_the_server_gives_them():
    assert abstained(answer({}, {"abstain": True})) is True
    assert abstained(answer({})) is None
    record = {"state": "s", "question": {"type": "noul", "instructions": "q?"}}
    items = [
        question_file.parse_line(
            1, json.dumps({**record, "expected": "yes", "group": g})
        )
        for g in "wxyz"
    ]
    says_yes, says_no = [0.0, -5.0], [-5.0, 0.0]
    readings = [
        Reading(says_yes, abstained=False),
        Reading(says_no, abstained=False),
        Reading(says_yes, abstained=False),
        Reading(says_no, abstained=True),
    ]
    figures = metrics(items, readings, 0)
    assert figures["accuracy"] == 0.5
    # of the three answered, two are right
    assert figures["abstention_rate"] == pytest.approx(0.25)
    assert figures["precision_reached"] == pytest.approx(2 / 3)
    # a server asked no precision says nothing, and neither do the figures
    assert "abstention_rate" not in metrics(items, [Reading(says_yes)] * 4, 0)


async def test_the_reasoning_row_continues_its_own_reasoning_to_a_key():
    """The reasoning is generated first, stopped at ``Answer:``; the answer is then read from the
    same chat continued after that reasoning, restricted to the keys."""
    item = question_file.parse_line(
        1,
        json.dumps(
            {
                "state": "I emailed you last week.",
                "question": {"type": "noul", "instructions": "Contacted before?"},
                "expected": "yes",
                "group": "g",
            }
        ),
    )
    sent: list[dict] = []

    def reply(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if len(sent) == 1:
            message = {"content": 'They say "I emailed you last week".\n'}
            return httpx.Response(200, json={"choices": [{"message": message}]})
        tokens = [{"logprob": math.log(0.9)}, {"logprob": 0.0}]
        choice = {"message": {"content": " yes"}, "logprobs": {"content": tokens}}
        return httpx.Response(200, json={"choices": [choice]})

    transport = httpx.MockTransport(reply)
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
        reading = await ask_reasoning(http, item, "m")
    think, answer_it = sent
    assert think["stop"] == ["Answer:"] and think["max_tokens"] == REASONING_TOKENS
    assert "reasoning" in think["messages"][0]["content"]
    assert answer_it["messages"][0] == think["messages"][0]
    assert answer_it["messages"][1] == {
        "role": "assistant",
        "content": 'They say "I emailed you last week".\nAnswer:',
    }
    assert answer_it["continue_final_message"] is True
    assert answer_it["add_generation_prompt"] is False
    assert answer_it["structured_outputs"] == {"choice": [" yes", " no"]}
    assert reading.scores == pytest.approx([math.log(0.9), math.log(0.1)])


def test_the_reasoning_row_runs_only_when_asked_for():
    plain = argparse.Namespace(rows=None, upstream_port=None)
    assert "reasoning" not in chosen_rows(plain) and "generation" in chosen_rows(plain)
    asked = argparse.Namespace(rows="default,reasoning", upstream_port=None)
    assert chosen_rows(asked) == ["default", "reasoning"]
