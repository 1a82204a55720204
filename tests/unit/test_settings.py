from __future__ import annotations

import importlib.util
import os

import pytest

from vllm.entrypoints.generate.decisions.decide.settings import (
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

# Also run on vLLM 0.32 (tools/test.sh's second pass): these touch vLLM's own APIs.
pytestmark = pytest.mark.vllm032


def test_defaults():
    s = Settings.from_env({})
    assert (s.max_questions, s.max_choices, s.max_levels, s.temperature) == (
        64,
        255,
        10,
        None,
    )
    assert s.backend.name is None


def test_backend_spec_arguments_are_typed():
    spec = parse_backend_spec("canvas:samples=5,ratio=0.5,exact=true,mode=fast")
    assert spec.name == "canvas"
    assert dict(spec.args) == {
        "samples": 5,
        "ratio": 0.5,
        "exact": True,
        "mode": "fast",
    }


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


def strictly_validated(envs, monkeypatch) -> None:
    """vLLM's check under --fail-on-environ-validation, over a freshly imported ``envs``: the module's own
    function on vLLM 0.30, the platform's (which reads ``vllm.envs``) on 0.32."""
    if hasattr(envs, "validate_environ"):
        envs.validate_environ(hard_fail=True)
        return
    import vllm
    from vllm.platforms.interface import Platform

    monkeypatch.setattr(vllm, "envs", envs)
    Platform.validate_environ(hard_fail=True)


def test_vllm_knows_every_variable_we_read(our_variables_only):
    """Strict environment validation (--fail-on-environ-validation) lets each of our settings through, and
    each reads as set, without raising (engine processes evaluate every variable)."""
    for name in VARIABLES:
        our_variables_only.setenv(name, "lots")
    envs = fresh_vllm_envs()
    strictly_validated(envs, our_variables_only)
    assert {
        name: envs.environment_variables[name]() for name in VARIABLES[1:]
    } == dict.fromkeys(VARIABLES[1:], "lots")


@pytest.mark.parametrize("version", ["0.30", "0.32"])
def test_the_patch_names_no_setting_settings_py_is_the_one_list(version):
    patch = (ROOT / "patches" / f"api-router-wire-v{version}.patch").read_text()
    added = "\n".join(line for line in patch.splitlines() if line.startswith("+"))
    assert not [name for name in VARIABLES[1:] if name.removeprefix(PREFIX) in added]
    assert f'_name.startswith("{PREFIX}")' in added


def test_a_name_no_setting_reads_is_refused_by_name(our_variables_only):
    typo = PREFIX + "MAX_QUESTION"
    our_variables_only.setenv(typo, "8")
    # declared by prefix: vLLM lets it through ...
    strictly_validated(fresh_vllm_envs(), our_variables_only)
    with pytest.raises(
        SettingsError,
        match=f"^{typo} is not a setting.*did you mean {PREFIX}MAX_QUESTIONS",
    ):
        # ... and we refuse it before the engine starts
        check_environment({ENABLE_VARIABLE: "1", typo: "8"})
    assert unknown_variables(
        {typo: "8", PREFIX + "ZZZ": "", PREFIX + "BACKEND": "logit"}
    ) == [typo, PREFIX + "ZZZ"]
    # off: none of ours is read
    assert check_environment({ENABLE_VARIABLE: "0", typo: "8"}) is None
