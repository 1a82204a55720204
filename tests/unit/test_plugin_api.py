"""The plugin API stays where plugins import it: every name below, from the package itself, the
entry-point groups, and the signature of a backend's ``read``. Moving a module inside the package
must not move any of them."""

from __future__ import annotations

import importlib
import inspect

PACKAGE = "vllm.entrypoints.generate.decisions"

# What a plugin may use, as docs/backends.md and docs/plugins.md name it.
PLUGIN_NAMES = {
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
}


def test_every_plugin_name_is_exported_by_the_package():
    package = importlib.import_module(PACKAGE)
    assert set(package.__all__) == PLUGIN_NAMES
    missing = [name for name in PLUGIN_NAMES if getattr(package, name, None) is None]
    assert missing == []


def test_the_entry_point_groups_are_the_documented_ones():
    from vllm.entrypoints.generate.decisions.runtime.plugins import GROUPS

    assert set(GROUPS) == {"vllm.decision_backends", "vllm.decision_question_types"}


def test_a_backend_reads_a_question_in_its_context():
    from vllm.entrypoints.generate.decisions import DecisionBackend

    parameters = list(inspect.signature(DecisionBackend.read).parameters)
    assert parameters == ["self", "question", "context"]
