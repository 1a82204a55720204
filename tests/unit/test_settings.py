from __future__ import annotations

import re

from vllm.entrypoints.generate.decisions.settings import VARIABLES, Settings, parse_backend_spec

from ..conftest import ROOT


def test_defaults():
    s = Settings.from_env({})
    assert (s.max_questions, s.max_choices, s.max_levels, s.temperature) == (64, 255, 10, None)
    assert s.backend.name is None


def test_backend_spec_arguments_are_typed():
    spec = parse_backend_spec("canvas:samples=5,ratio=0.5,exact=true,mode=fast")
    assert spec.name == "canvas"
    assert dict(spec.args) == {"samples": 5, "ratio": 0.5, "exact": True, "mode": "fast"}


def test_the_patch_declares_every_variable_we_read():
    patch = (ROOT / "patches" / "api-router-wire-v0.30.patch").read_text()
    added = "\n".join(line for line in patch.splitlines() if line.startswith("+"))
    declared = set(re.findall(r'"(VLLM_ENABLE_TYPED_DECISIONS)"', added))
    declared |= {f"VLLM_TYPED_DECISIONS_{n}" for n in re.findall(r'^\+\s+"([A-Z_]+)",$', added, re.M)}
    assert set(VARIABLES) <= declared
