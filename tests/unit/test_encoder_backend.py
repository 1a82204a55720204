"""The encoder backend over a host whose pooling pass is the plain-PyTorch Laya reference on the tiny
checkpoint: prompts, slot order, refusals, and which prompt builder runs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from vllm.entrypoints.generate.decisions.decide.backends import EncoderBackend
from vllm.entrypoints.generate.decisions.decide.backends.encoder import laya_prompts
from vllm.entrypoints.generate.decisions.decide.backends.registry import choose_backend
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.host import BackendHost
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    SCORE,
    ChoiceQuestion,
    NoulQuestion,
    ScoreQuestion,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.settings import BackendSpec

from ..conftest import model_path
from ..laya_reference import reference_outputs

CHECKPOINT = "tiny-laya"


class LayaHost(BackendHost):
    """The served checkpoint's files and tokenizer; ``pool`` runs the reference model."""

    def __init__(
        self,
        folder: Path,
        trust_remote_code: bool = False,
        files: dict[str, bytes] | None = None,
    ):
        from transformers import AutoTokenizer

        self.folder = folder
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.trust_remote_code = trust_remote_code
        self.files = files
        self.served_model = "tiny-laya"
        self.max_model_len = 1024
        self.architectures = ("LayaForDecision",)
        self.max_logprobs, self.max_logprob_token_ids, self.logprobs_mode = (
            20,
            128,
            "raw_logprobs",
        )
        self.pooled: list[list[int]] = []

    def checkpoint_config(self):
        return json.loads((self.folder / "config.json").read_text())

    def checkpoint_file(self, name: str) -> bytes | None:
        if self.files is not None:
            return self.files.get(name)
        path = self.folder / name
        return path.read_bytes() if path.is_file() else None

    async def pool(self, prompt_ids, task, request_id):
        assert task == "token_classify"
        self.pooled.append(prompt_ids)
        return reference_outputs(self.folder, prompt_ids)

    async def render_chat(self, messages):
        raise AssertionError("the encoder backend renders no chat")

    def encode(self, text):
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids):
        return self.tokenizer.decode(list(token_ids))

    def special_token_ids(self):
        return frozenset(self.tokenizer.all_special_ids)

    async def read_token_logprobs(self, prompt_ids, token_ids, request_id, fp32=False):
        raise AssertionError("the encoder backend reads no logprobs")

    async def read_top_logprobs(self, prompt_ids, k, request_id, fp32=False):
        raise AssertionError("the encoder backend reads no logprobs")


@pytest.fixture(scope="module")
def folder() -> Path:
    return model_path(CHECKPOINT)


def plugin_question(name: str):
    """A question of the example plugin's type (tests/plugin, installed by the test command)."""
    from decisions_test_plugin import SentimentType

    qtype = SentimentType()
    return qtype.compile(qtype.model(type=name))


def started(host: LayaHost) -> EncoderBackend:
    backend = EncoderBackend(host)
    asyncio.run(backend.start())
    return backend


def read(
    backend: EncoderBackend,
    question,
    state: str = "The parcel arrived broken and late.",
):
    return asyncio.run(backend.read(question, ReadContext.about(state, "r")))


def test_chosen_for_the_architecture_by_itself():
    assert choose_backend(BackendSpec(None, {}), ("LayaForDecision",)) is EncoderBackend


def test_noul_is_read_false_then_true_and_answered_true_then_false(folder):
    host = LayaHost(folder)
    backend = started(host)
    question = NOUL.compile(
        NoulQuestion(
            instructions="Is the customer unhappy?", criteria={"true": "they complain"}
        )
    )
    reading = read(backend, question)
    ids = host.pooled[-1]
    tokenizer = host.tokenizer
    expected, markers = laya_prompts.build_prompt(
        tokenizer,
        "The parcel arrived broken and late.",
        "noul",
        "Is the customer unhappy?",
        ["false: no, the statement does not hold", "true: they complain"],
        max_len=512,
        head_max_len=192,
        option_max_tokens=48,
    )
    assert ids == expected and len(markers) == 2
    slots = reference_outputs(folder, ids)
    assert reading.scores == [slots[1], slots[0]]  # our order is true, false
    assert reading.meta.act_scores == slots[2:] and len(slots[2:]) == 3
    assert reading.meta.prompt_source == "built-in" and reading.forward_passes == 1
    assert reading.meta.checkpoint_temperature == 1.2  # the checkpoint's noul:2 bucket
    assert reading.input_tokens == len(ids) and reading.readout == "direct"
    assert len(set(reading.scores)) == 2


def test_choice_and_score_keep_their_order_and_say_level(folder):
    host = LayaHost(folder)
    backend = started(host)
    choice = CHOICE.compile(
        ChoiceQuestion(
            instructions="Which team?",
            criteria={"billing": "money", "shipping": None, "returns": "sending back"},
        )
    )
    reading = read(backend, choice)
    assert reading.scores == reference_outputs(folder, host.pooled[-1])[:3]
    assert reading.meta.checkpoint_temperature == 0.8  # the choice:3-5 bucket
    score = SCORE.compile(
        ScoreQuestion(instructions="How urgent?", criteria=["not", "somewhat", "very"])
    )
    read(backend, score)
    text = host.tokenizer.decode(host.pooled[-1])
    # as the tiny (lower-case) tokenizer decodes
    assert "level 0 : not" in text and "level 2 : very" in text


@pytest.mark.parametrize(
    ("question", "message"),
    [
        (
            lambda: plugin_question("sentiment"),
            "answers choice, noul, score questions; 'sentiment'",
        ),
        (
            lambda: CHOICE.compile(
                ChoiceQuestion(criteria={f"c{i}": None for i in range(256)})
            ),
            "marks at most 255 (laya_config.max_options)",
        ),
        (
            lambda: CHOICE.compile(
                ChoiceQuestion(criteria={f"c{i}": "one two three" for i in range(40)})
            ),
            "(laya_config.head_max_len)",
        ),
        (
            lambda: CHOICE.compile(
                ChoiceQuestion(criteria={"a": "word " * 60, "b": None})
            ),
            "per option (laya_config.option_max_tokens)",
        ),
    ],
)
def test_what_the_checkpoint_cannot_mark_is_refused_per_question(
    folder, question, message
):
    host = LayaHost(folder)
    with pytest.raises(
        DecisionError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        read(started(host), question())
    assert host.pooled == []  # refused before any model work


def test_an_input_past_max_len_is_refused_not_cut(folder):
    host = LayaHost(folder)
    question = NOUL.compile(NoulQuestion(instructions="Late?"))
    with pytest.raises(
        DecisionError, match=r"reads at most \d+ \(laya_config.max_len = 512\)"
    ):
        read(started(host), question, state="late " * 600)
    assert host.pooled == []


BUILDER = (Path(laya_prompts.__file__)).read_bytes()


def test_the_checkpoint_builder_runs_only_with_trust_remote_code(folder):
    wording = BUILDER.replace(
        b'f"{question_type} question: {instructions}"',
        b'f"{question_type} question: {instructions} !"',
    )
    assert wording != BUILDER
    question = NOUL.compile(NoulQuestion(instructions="Late?"))
    untrusted = LayaHost(
        folder, trust_remote_code=False, files={"laya_prompts.py": wording}
    )
    assert read(started(untrusted), question).meta.prompt_source == "built-in"
    trusted = LayaHost(
        folder, trust_remote_code=True, files={"laya_prompts.py": wording}
    )
    assert read(started(trusted), question).meta.prompt_source == "checkpoint"
    # the checkpoint's own wording was used
    assert trusted.pooled[-1] != untrusted.pooled[-1]
    assert (
        read(started(LayaHost(folder, True, files={})), question).meta.prompt_source
        == "built-in"
    )


@pytest.mark.parametrize(
    ("files", "config", "message"),
    [
        ({"laya_prompts.py": b"x = 1\n"}, {}, "defines no build_prompt"),
        ({}, {"mask_token_id": 1}, "the model would find no option markers"),
        (
            {},
            {"question_type_token_ids": {"choice": 1, "score": 2, "noul": 3}},
            "prompts and checkpoint disagree",
        ),
        ({}, {"max_len": "long"}, "laya_config.max_len"),
    ],
)
def test_a_checkpoint_that_disagrees_with_itself_stops_startup(
    folder, files, config, message
):
    host = LayaHost(folder, trust_remote_code=True, files=files)
    original = host.checkpoint_config()
    host.checkpoint_config = lambda: {
        **original,
        "laya_config": {**original["laya_config"], **config},
    }  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match=message):
        started(host)


def test_a_model_output_of_the_wrong_size_is_a_fault_not_an_answer(folder):
    host = LayaHost(folder)
    backend = started(host)

    async def short(prompt_ids, task, request_id):
        return [0.5]

    host.pool = short  # type: ignore[method-assign]
    with pytest.raises(
        DecisionError, match="returned 1 values for 2 options and 3 act scores"
    ) as caught:
        read(backend, NOUL.compile(NoulQuestion(instructions="Late?")))
    assert caught.value.status == 500
