"""One rendering budget per request (budget.py), counts checked before compiling, and prompts too long for
the context refused by their length before they are tokenized (token_bound.py, stencil.py)."""

from __future__ import annotations

import json
import sys
import unicodedata

import pytest

from vllm.entrypoints.generate.decisions.decide.backends.logit.stencil import (
    StencilPool,
    check_fits,
)
from vllm.entrypoints.generate.decisions.decide.budget import (
    RenderBudget,
    check_depth,
    json_depth,
)
from vllm.entrypoints.generate.decisions.decide.engine import token_bound
from vllm.entrypoints.generate.decisions.decide.engine.token_bound import (
    chars_per_token,
    normalizer_shrink,
)
from vllm.entrypoints.generate.decisions.decide.errors import OverLimitError
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import question_text
from vllm.entrypoints.generate.decisions.decide.questions import (
    NOUL,
    NoulQuestion,
    Option,
    QuestionType,
    content_text,
)
from vllm.entrypoints.generate.decisions.decide.serving.request import DecisionRequest
from vllm.entrypoints.generate.decisions.decide.serving.service import (
    DecisionService,
    request_chars,
)
from vllm.entrypoints.generate.decisions.decide.settings import PREFIX, Settings
from vllm.entrypoints.generate.decisions.http.wire.jev import serving as jev
from vllm.entrypoints.generate.decisions.http.wire.jev.protocol import SystemOneRequest
from vllm.entrypoints.generate.decisions.http.wire.openai import serving as openai
from vllm.entrypoints.generate.decisions.http.wire.openai.protocol import (
    DecisionsRequest,
)

from ..fuzzing import AMPLIFYING, nested
from .fakes import ScriptedBackend, TokenizerHost


def settings(**values: str) -> Settings:
    return Settings.from_env(
        {PREFIX + name.upper(): value for name, value in values.items()}
    )


class Recorded(RenderBudget):
    """A budget that keeps every charge, to see how much was rendered before the refusal."""

    made: list[Recorded] = []

    @classmethod
    def of(cls, settings: Settings) -> Recorded:
        made = cls(
            settings.max_request_chars,
            settings.max_json_depth,
            settings.max_input_chars,
        )
        cls.made.append(made)
        return made


@pytest.fixture
def recorded(monkeypatch):
    Recorded.made = []
    for module in (jev, openai):
        monkeypatch.setattr(module, "RenderBudget", Recorded)
    return Recorded.made


def test_depth_is_counted_without_recursion_and_refused_naming_the_setting():
    assert [
        json_depth(v, 10) for v in (1, "x", {}, [], {"a": 1}, [[1]], {"a": [{}]})
    ] == [0, 0, 0, 0, 1, 2, 2]
    # stops counting past the limit; no RecursionError
    assert json_depth(nested(100_000), 800) == 801
    check_depth(nested(800), 800)
    with pytest.raises(
        OverLimitError, match=f"deeper than 800 levels .*{PREFIX}MAX_JSON_DEPTH"
    ):
        check_depth(nested(801), 800)


def test_a_budget_refuses_the_charge_that_crosses_it():
    budget = RenderBudget(10)
    budget.charge(10)
    with pytest.raises(
        OverLimitError, match=f"more than 10 characters .*{PREFIX}MAX_REQUEST_CHARS"
    ):
        budget.charge(1)


def test_content_text_charges_the_budget_it_is_given_and_stops_where_it_runs_out():
    value = [nested(50)] * 10  # each copy renders to ~5 K characters
    big = 10**9
    whole = content_text(value, RenderBudget(big, max_value_chars=big))
    spent = RenderBudget(big, max_value_chars=big)
    assert content_text(value, spent) == whole
    assert content_text("a plain string is in the body already", spent)
    assert spent.spent == len(whole)
    spent = RenderBudget(len(whole) // 3, max_value_chars=big)
    with pytest.raises(OverLimitError, match="MAX_REQUEST_CHARS"):
        content_text(value, spent)
    # refused at the crossing, not after
    assert len(whole) // 3 < spent.spent < len(whole) // 3 + 300
    with pytest.raises(OverLimitError, match="MAX_JSON_DEPTH"):
        content_text(value, RenderBudget(big, max_depth=49, max_value_chars=big))


def test_one_value_is_still_held_to_max_input_chars_within_a_large_budget():
    with pytest.raises(OverLimitError, match="MAX_INPUT_CHARS"):
        content_text(nested(300), RenderBudget(10**9, max_value_chars=1000))


def test_nested_jev_questions_are_refused_once_the_request_renders_past_its_budget(
    recorded,
):
    (body,) = [b for p, b, what in AMPLIFYING if what.startswith("Jev: 16 questions")]
    request = SystemOneRequest.model_validate(json.loads(body))
    with pytest.raises(OverLimitError, match=f"{PREFIX}MAX_REQUEST_CHARS"):
        jev.compiled(request, "r", settings())
    (spent,) = recorded
    limit = 4 * 1_000_000
    # ~4 M of the ~16 M characters asked for, then refused
    assert limit < spent.spent < limit + 2000


def test_sixty_json_parts_are_refused_once_the_input_renders_past_its_budget(recorded):
    (body,) = [
        b for p, b, what in AMPLIFYING if what.startswith("OpenAI: 60 input_json")
    ]
    request = DecisionsRequest.model_validate(json.loads(body))
    with pytest.raises(OverLimitError, match=f"{PREFIX}MAX_REQUEST_CHARS"):
        openai.compiled(request, "r", settings(max_request_chars="1000000"))
    assert 1_000_000 < recorded[0].spent < 1_002_000


def test_a_request_within_its_budget_compiles_as_before(recorded):
    request = SystemOneRequest.model_validate(
        {
            "state": {"order": nested(20)},
            "questions": {"q": {"type": "noul", "instructions": nested(20)}},
        }
    )
    _, asked = jev.compiled(request, "r", settings())
    assert asked.state == content_text({"order": nested(20)}) and asked.questions[
        0
    ].instructions == content_text(nested(20))
    assert recorded[0].spent == len(asked.state) + len(asked.questions[0].instructions)


def test_question_counts_are_refused_before_any_question_is_compiled(recorded):
    many = {
        f"q{i}": {"type": "no-such-type", "instructions": nested(300)}
        for i in range(65)
    }
    with pytest.raises(OverLimitError, match=f"65 questions .*{PREFIX}MAX_QUESTIONS"):
        jev.compiled(
            SystemOneRequest.model_validate({"state": "x", "questions": many}),
            "r",
            settings(),
        )
    questions = [
        {
            "type": "predicate",
            "instructions": [{"type": "input_json", "data": nested(300)}],
        }
    ] * 65
    with pytest.raises(OverLimitError, match=f"65 questions .*{PREFIX}MAX_QUESTIONS"):
        openai.compiled(
            DecisionsRequest.model_validate(
                {"model": "m", "input": "x", "questions": questions}
            ),
            "r",
            settings(),
        )
    assert recorded == []  # no budget was even opened


def test_option_counts_are_refused_before_the_question_is_compiled(recorded):
    criteria = {
        f"c{i}": nested(300) for i in range(300)
    }  # each description renders to ~180 K characters
    request = SystemOneRequest.model_validate(
        {"state": "x", "questions": {"q": {"type": "choice", "criteria": criteria}}}
    )
    with pytest.raises(
        OverLimitError, match=f"questions.q has 300 choices.*{PREFIX}MAX_CHOICES"
    ):
        jev.compiled(request, "r", settings())
    levels = [{"label": f"l{i}"} for i in range(11)]
    request = DecisionsRequest.model_validate(
        {
            "model": "m",
            "input": "x",
            "questions": [{"type": "score", "instructions": "?", "levels": levels}],
        }
    )
    with pytest.raises(
        OverLimitError, match=f"questions\\[0\\] has 11 levels.*{PREFIX}MAX_LEVELS"
    ):
        openai.compiled(request, "r", settings())
    assert all(budget.spent == 0 for budget in recorded)


class Tags(QuestionType):
    """A plugin type written to the plugin docs: its methods take no budget."""

    name = "budget-tags"
    model = NoulQuestion

    def options(self, question):
        return [Option(key=k, value=k, text=k * 400) for k in "ab"]

    def answer(self, probabilities, options):
        return {}


class BudgetedTags(Tags):
    """The same type, rendering within the budget it is given."""

    name = "budget-tags-budgeted"

    def options(self, question, budget=None):
        return [
            Option(key=k, value=k, text=content_text([k] * 100, budget)) for k in "ab"
        ]


def test_a_plugin_type_without_a_budget_has_its_texts_charged_once_made():
    assert (Tags.budgeted, BudgetedTags.budgeted) == ((True, False), (True, True))
    question = NoulQuestion(instructions={"ask": "which?"})
    spent = RenderBudget()
    compiled = Tags().compile(question, spent)
    assert spent.spent == sum(len(t) for t in compiled_texts(compiled))
    with pytest.raises(OverLimitError, match=f"{PREFIX}MAX_REQUEST_CHARS"):
        Tags().compile(question, RenderBudget(500))
    spent = RenderBudget()
    compiled = BudgetedTags().compile(question, spent)
    assert spent.spent == sum(len(t) for t in compiled_texts(compiled))
    # refused where rendering crosses the budget, the second option never rendered
    spent = RenderBudget(250)
    with pytest.raises(OverLimitError, match=f"{PREFIX}MAX_REQUEST_CHARS"):
        BudgetedTags().compile(question, spent)
    assert spent.spent < 250 + 10


def compiled_texts(compiled):
    return [compiled.instructions, *(o.text for o in compiled.options)]


def test_the_service_holds_any_request_to_the_total_however_it_was_built():
    question = NOUL.compile(NoulQuestion(instructions="x" * 600))
    request = DecisionRequest("s" * 500, (question, question), ("a", "b"), "r")
    assert request_chars(request) == 500 + 2 * (600 + len("Yes") + len("No"))
    service = DecisionService(
        settings(max_request_chars="1000"), ScriptedBackend(lambda q: [0.0, 0.0]), "m"
    )
    with pytest.raises(
        OverLimitError, match=f"more than 1000 characters .*{PREFIX}MAX_REQUEST_CHARS"
    ):
        service.check_limits(request)
    DecisionService(
        settings(max_request_chars="1710"), service.backend, "m"
    ).check_limits(request)


# --- the bound on characters per token ----------------------------------------------------------


def test_composition_is_the_longest_canonical_decomposition():
    longest = max(
        len(unicodedata.normalize("NFD", chr(c)))
        for c in range(sys.maxunicode + 1)
        if not 0xD800 <= c <= 0xDFFF
    )
    assert longest == token_bound.COMPOSITION


def test_only_normalizers_that_shorten_text_by_a_known_factor_get_a_bound():
    assert normalizer_shrink(None) == 1
    assert normalizer_shrink({"type": "NFC"}) == token_bound.COMPOSITION
    prepend_replace = [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
    ]
    assert normalizer_shrink({"type": "Sequence", "normalizers": prepend_replace}) == 1
    for unbounded in (
        {
            "type": "Replace",
            "pattern": {"Regex": " +"},
            "content": " ",
        },  # collapses runs
        {"type": "Replace", "pattern": {"String": "  "}, "content": " "},
        {"type": "Replace", "pattern": {"String": "x"}, "content": ""},
        {"type": "Strip", "strip_left": True, "strip_right": True},
        {"type": "Precompiled", "precompiled_charsmap": "..."},
        {"type": "BertNormalizer", "strip_accents": True},
        {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Strip"}]},
    ):
        assert normalizer_shrink(unbounded) is None, unbounded


@pytest.mark.parametrize(
    "text",
    [
        "word " * 2000,
        " " * 5000,
        "=" * 5000,
        "-" * 4000 + "\n" * 3000,
        "\t" * 3000,
        "a" * 3000,
        "e\u0301" * 2000,
        "東京" * 2000,
        "🚀" * 1000,
        "<|im_start|>" * 300,
        "0123456789" * 500,
    ],
)
def test_no_text_needs_fewer_tokens_than_the_bound_says(any_tokenizer, text):
    per = chars_per_token(any_tokenizer)
    # byte-level BPE (SmolLM2, Qwen2) and BPE with byte fallback (Llama)
    assert per is not None
    tokens = len(any_tokenizer.encode(text, add_special_tokens=False))
    assert len(text) <= per * tokens


def test_a_tokenizer_that_may_produce_unknown_tokens_gets_no_bound():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    wordpiece = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordPiece({"[UNK]": 0}, unk_token="[UNK]"))
    )
    assert chars_per_token(wordpiece) is None
    assert chars_per_token(object()) is None  # a slow tokenizer: no backend to read


def host_with_bound(tokenizer, max_model_len: int) -> TokenizerHost:
    host = TokenizerHost(tokenizer, max_model_len=max_model_len)
    host.chars_per_token = chars_per_token(tokenizer)
    return host


def test_check_fits_refuses_only_what_can_never_fit(smollm2_tokenizer):
    host = host_with_bound(smollm2_tokenizer, 100)
    per = host.chars_per_token
    check_fits(host, 10, per * 89)  # could be 99 tokens
    with pytest.raises(
        OverLimitError, match="at least 100 tokens .*--max-model-len 100"
    ):
        check_fits(host, 10, per * 89 + 1)
    # no bound: nothing refused here
    check_fits(TokenizerHost(smollm2_tokenizer, max_model_len=100), 10, 10**9)


async def test_a_long_question_is_refused_by_its_length_before_it_is_tokenized(
    smollm2_tokenizer,
):
    host = host_with_bound(smollm2_tokenizer, 200)
    encoded: list[int] = []
    encode = host.encode
    host.encode = lambda text: encoded.append(len(text)) or encode(text)  # type: ignore[method-assign]
    pool = StencilPool(host)
    question = NOUL.compile(NoulQuestion(instructions="word " * 10_000))
    with pytest.raises(OverLimitError, match="--max-model-len 200"):
        await pool.prompt_ids("a short state", question_text(question, ["A", "B"]))
    # only the stencil's seam check; never the long question
    assert max(encoded, default=0) < 1000
    # A question that fits is tokenized (in a worker thread) exactly as before.
    short = question_text(
        NOUL.compile(NoulQuestion(instructions="Is it urgent?")), ["A", "B"]
    )
    assert await pool.prompt_ids("a short state", short) == await StencilPool(
        host, enabled=False
    ).prompt_ids("a short state", short)


async def test_a_state_too_long_for_any_prompt_is_refused_before_the_stencil_tokenizes_it(
    smollm2_tokenizer,
):
    host = host_with_bound(smollm2_tokenizer, 200)
    offsets: list[int] = []
    with_offsets = host.encode_with_offsets
    # type: ignore[method-assign]
    host.encode_with_offsets = lambda text: (
        offsets.append(len(text)) or with_offsets(text)
    )
    with pytest.raises(OverLimitError, match="--max-model-len 200"):
        await StencilPool(host).prompt_ids("word " * 10_000, "Question: ?")
    assert offsets == []
