from __future__ import annotations

import importlib.util
import os

import pytest

from vllm.entrypoints.generate.decisions.settings import (
    ENABLE_VARIABLE,
    PREFIX,
    VARIABLES,
    Settings,
    SettingsError,
    check_environment,
    parse_backend_spec,
    unknown_variables,
)

from ..conftest import ROOT


def test_defaults():
    s = Settings.from_env({})
    assert (s.max_questions, s.max_choices, s.max_levels, s.temperature) == (64, 255, 10, None)
    assert s.backend.name is None


def test_backend_spec_arguments_are_typed():
    spec = parse_backend_spec("canvas:samples=5,ratio=0.5,exact=true,mode=fast")
    assert spec.name == "canvas"
    assert dict(spec.args) == {"samples": 5, "ratio": 0.5, "exact": True, "mode": "fast"}


def fresh_vllm_envs():
    """vllm/envs.py as installed (the router patch applied), run again now: it declares what it finds in
    the environment when it is imported, and the imported one saw the test run's environment."""
    import vllm.envs

    spec = importlib.util.spec_from_file_location("vllm_envs_again", vllm.envs.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def our_variables_only(monkeypatch):
    for name in [n for n in os.environ if n.startswith(PREFIX) or n == ENABLE_VARIABLE]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_vllm_knows_every_variable_we_read(our_variables_only):
    """Strict environment validation (--fail-on-environ-validation) lets each of our settings through, and
    each reads as set, without raising (engine processes evaluate every variable)."""
    for name in VARIABLES:
        our_variables_only.setenv(name, "lots")
    envs = fresh_vllm_envs()
    envs.validate_environ(hard_fail=True)
    assert {name: envs.environment_variables[name]() for name in VARIABLES[1:]} == dict.fromkeys(VARIABLES[1:], "lots")


def test_the_patch_names_no_setting_settings_py_is_the_one_list():
    patch = (ROOT / "patches" / "api-router-wire-v0.30.patch").read_text()
    added = "\n".join(line for line in patch.splitlines() if line.startswith("+"))
    assert not [name for name in VARIABLES[1:] if name.removeprefix(PREFIX) in added]
    assert f'_name.startswith("{PREFIX}")' in added


def test_a_name_no_setting_reads_is_refused_by_name(our_variables_only):
    typo = PREFIX + "MAX_QUESTION"
    our_variables_only.setenv(typo, "8")
    fresh_vllm_envs().validate_environ(hard_fail=True)  # declared by prefix: vLLM lets it through ...
    with pytest.raises(SettingsError, match=f"^{typo} is not a setting.*did you mean {PREFIX}MAX_QUESTIONS"):
        check_environment({ENABLE_VARIABLE: "1", typo: "8"})  # ... and we refuse it before the engine starts
    assert unknown_variables({typo: "8", PREFIX + "ZZZ": "", PREFIX + "BACKEND": "logit"}) == [typo, PREFIX + "ZZZ"]
    assert check_environment({ENABLE_VARIABLE: "0", typo: "8"}) is None  # off: none of ours is read
