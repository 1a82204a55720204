# SPDX-License-Identifier: Apache-2.0
"""Typed decisions for vLLM: ``/v1/decisions`` (OpenAI's format) and ``/v1/systemone`` (Jev's), and the
plugin API for backends and question types (docs/plugins.md)."""

from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend, Reading
from vllm.entrypoints.generate.decisions.decide.backends.registry import (
    register_backend,
    register_question_type,
)
from vllm.entrypoints.generate.decisions.decide.errors import (
    BackendUnavailable,
    DecisionError,
)
from vllm.entrypoints.generate.decisions.decide.host import (
    BackendHost,
    Generation,
    TokenRead,
)
from vllm.entrypoints.generate.decisions.decide.prompting.chat_template import (
    takes_system_role,
)
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import (
    messages as standard_messages,
)
from vllm.entrypoints.generate.decisions.decide.questions import (
    CompiledQuestion,
    Option,
    OptionsLimit,
    QuestionModel,
    QuestionType,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext

__all__ = [
    "BackendHost",
    "BackendUnavailable",
    "CompiledQuestion",
    "DecisionBackend",
    "DecisionError",
    "Generation",
    "Option",
    "OptionsLimit",
    "QuestionModel",
    "QuestionType",
    "ReadContext",
    "Reading",
    "TokenRead",
    "register_backend",
    "register_question_type",
    "standard_messages",
    "takes_system_role",
]
