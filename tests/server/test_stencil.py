"""The state rendered once per request gives the engine exactly the prompt of rendering each question in
full: the same number of prompt tokens, and the same label log-probabilities as vLLM's own
/v1/completions reading the fully rendered prompt under the same cache state."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from tools.common.tokenizer_host import TokenizerOnlyHost
from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import (
    AnswerSlotPlacer,
)
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import messages
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    ChoiceQuestion,
    NoulQuestion,
)

from ..conftest import model_path

STATES = [
    "Ticket: My payouts have been failing for 3 days and I need the money today.",
    "Trailing blanks and tabs   \t \n\n\n",
    "Straße Ærøskøbing naïve café 東京は日本の首都です。 🚀👩‍💻 " * 5,
    "Order 66125 shipped 2026-11-30T09:45:00Z; refund 12.50 EUR!!! ...",
]
QUESTIONS = [
    (
        {"type": "predicate", "instructions": "Is this urgent?"},
        NOUL.compile(NoulQuestion(instructions="Is this urgent?")),
    ),
    (
        {
            "type": "choice",
            "instructions": "Which team?",
            "choices": [{"value": v} for v in ("billing", "tech", "sales")],
        },
        CHOICE.compile(
            ChoiceQuestion(
                instructions="Which team?",
                criteria={"billing": None, "tech": None, "sales": None},
            )
        ),
    ),
]


def test_startup_check_switched_it_on(server):
    assert "state rendered once per request" in server.log.read_text()


@pytest.mark.parametrize("state", STATES, ids=range(len(STATES)))
def test_shared_rendering_matches_full_rendering(client, state):
    # One read per question in the head's own dtype (debias off, precision model), as /v1/completions reads.
    body = {
        "model": "m",
        "input": state,
        "extra": {
            "backend_options": {"logprobs": "exact", "precision": "model"},
            "debias": "off",
        },
        "questions": [wire for wire, _ in QUESTIONS],
    }
    # Asked twice: the second time every full block of each prompt comes from the prefix cache, as it
    # will for the bare reads below. (On this CPU in bfloat16 a read computed afresh and one over cached
    # blocks differ by a few hundredths in log-probability, so only like is compared with like.)
    assert client.post("/v1/decisions", json=body).status_code == 200
    response = client.post("/v1/decisions", json=body)
    assert response.status_code == 200, response.text
    host = TokenizerOnlyHost(
        AutoTokenizer.from_pretrained(model_path("smollm2-135m-instruct"))
    )
    placer = AnswerSlotPlacer(host)
    for answer, (_, compiled) in zip(
        response.json()["answers"], QUESTIONS, strict=True
    ):
        labels = [chr(ord("A") + i) for i in range(len(compiled.options))]
        slot = placer.place(
            asyncio.run(host.render_chat(messages(state, compiled, labels))), labels
        )
        assert answer["extra"]["audit"]["input_tokens"] == len(slot.prompt_ids)
        bare = client.post(
            "/v1/completions",
            json={
                "model": client.get("/v1/models").json()["data"][0]["id"],
                "prompt": slot.prompt_ids,
                "max_tokens": 1,
                "logprobs": 1,
                "logprob_token_ids": slot.label_ids,
                "return_tokens_as_token_ids": True,
            },
        )
        assert bare.status_code == 200, bare.text
        read = bare.json()["choices"][0]["logprobs"]["top_logprobs"][0]
        expected = [read[f"token_id:{t}"] for t in slot.label_ids]
        ours = list(answer["extra"]["backend"]["option_logits"].values())
        assert ours == pytest.approx(expected, abs=1e-5), (ours, expected)
