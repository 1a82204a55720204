"""How the decision prompt meets chat templates without a system role, and models with no template at all
(real tokenizer, scripted reads: no model runs)."""

from __future__ import annotations

import pytest

from vllm.entrypoints.generate.decisions.decide.backends.logit import LogitBackend
from vllm.entrypoints.generate.decisions.decide.errors import BackendUnavailable
from vllm.entrypoints.generate.decisions.decide.prompting.chat_template import (
    takes_system_role,
)
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import SYSTEM_PROMPT
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.settings import Settings

from ..conftest import model_path
from .fakes import TokenizerHost
from .test_logit_backend import choice, letter_loving

TURNS = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Gemma 2's way: a system message is an error.
REFUSES_SYSTEM = (
    "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    + TURNS
)
# Some templates skip roles they don't know, without a word.
DROPS_SYSTEM = TURNS.replace(
    "{% for m in messages %}", "{% for m in messages if m.role != 'system' %}"
)


async def test_a_template_with_a_system_role_takes_the_instructions_there(
    smollm2_tokenizer,
):
    assert await takes_system_role(
        TokenizerHost(smollm2_tokenizer, chat_template=TURNS)
    )


@pytest.mark.parametrize(
    "template", [REFUSES_SYSTEM, DROPS_SYSTEM], ids=["refuses", "drops"]
)
async def test_without_a_system_role_the_instructions_open_the_user_turn(
    smollm2_tokenizer, template
):
    host = TokenizerHost(smollm2_tokenizer, chat_template=template)
    assert not await takes_system_role(host)
    host.logprob = letter_loving(host)
    backend = LogitBackend(host, settings=Settings.from_env({}))
    facts = await backend.start()
    assert not facts.system_role and facts.option_mass > 0.5
    await backend.runner.labelled_read(
        choice(3), "exact", ReadContext.about("A ticket.", "r")
    )
    prompt = host.decode(host.reads[-1][0])
    assert prompt.startswith(
        f"<|im_start|>user\n{SYSTEM_PROMPT}\n\nDocument:\nA ticket.\n\nQuestion: Which?"
    )
    assert "system" not in prompt


async def test_a_model_with_no_chat_template_is_refused_with_what_to_pass():
    from transformers import AutoTokenizer

    base_model = AutoTokenizer.from_pretrained(model_path("smollm2-135m-instruct"))
    base_model.chat_template = None
    host = TokenizerHost(base_model)
    with pytest.raises(BackendUnavailable, match="--chat-template"):
        await LogitBackend(host, settings=Settings.from_env({})).start()
