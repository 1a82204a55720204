"""Each variable of ours: the values it reads leniently and the ones it refuses, with a message naming the
variable and what it accepts; and vLLM's side of the check, through the router patch (vllm/envs.py reads
VLLM_ENABLE_TYPED_DECISIONS without ever raising; vLLM's serve-argument check refuses a bad value before
any engine starts)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm.entrypoints.generate.decisions.decide import settings
from vllm.entrypoints.generate.decisions.decide.settings import (
    ENABLE_VARIABLE,
    PREFIX,
    VARIABLES,
    Debias,
    Settings,
    SettingsError,
    check_environment,
    decisions_enabled,
)

from .test_settings import fresh_vllm_envs

ON = ["1", "true", "TRUE", " yes ", "On"]
OFF = ["", "  ", "0", "false", "No", " OFF "]
NOT_SWITCHES = ["maybe", "2", "enable", "1.0", "tru"]


def read(variable: str, value: str, field: str):
    return getattr(Settings.from_env({PREFIX + variable: value}), field)


@pytest.mark.parametrize("value", ON)
def test_switch_on_words(value):
    assert decisions_enabled({ENABLE_VARIABLE: value}) is True


@pytest.mark.parametrize("value", [None, *OFF])
def test_switch_off_words_and_unset(value):
    assert decisions_enabled({} if value is None else {ENABLE_VARIABLE: value}) is False


@pytest.mark.parametrize("value", NOT_SWITCHES)
def test_switch_refuses_other_words_naming_the_accepted_ones(value):
    with pytest.raises(
        SettingsError,
        match=rf"^{ENABLE_VARIABLE}='{value}': expected 1, true, yes or on .* empty",
    ):
        decisions_enabled({ENABLE_VARIABLE: value})


# (variable, value, Settings field, what it reads as); an empty value is the default.
LENIENT = [
    ("BACKEND", "", "backend", settings.BackendSpec(None, {})),
    ("BACKEND", " logit ", "backend", settings.BackendSpec("logit", {})),
    (
        "BACKEND",
        "canvas: samples=5 , exact=TRUE",
        "backend",
        settings.BackendSpec("canvas", {"samples": 5, "exact": True}),
    ),
    ("TEMPERATURE", "", "temperature", None),
    ("TEMPERATURE", " 2.5 ", "temperature", 2.5),
    ("MIN_TEMPERATURE", "", "min_temperature", settings.DEFAULT_MIN_TEMPERATURE),
    ("MIN_TEMPERATURE", "0.05", "min_temperature", 0.05),
    ("MAX_TEMPERATURE", "", "max_temperature", settings.DEFAULT_MAX_TEMPERATURE),
    ("MAX_TEMPERATURE", " 20 ", "max_temperature", 20.0),
    ("MAX_QUESTIONS", "", "max_questions", 64),
    ("MAX_QUESTIONS", " 12 ", "max_questions", 12),
    ("MAX_CHOICES", "", "max_choices", 255),
    ("MAX_CHOICES", "2", "max_choices", 2),
    ("MAX_LEVELS", " ", "max_levels", 10),
    ("MAX_LEVELS", "7", "max_levels", 7),
    ("MAX_BODY_BYTES", "", "max_body_bytes", settings.DEFAULT_MAX_BODY_BYTES),
    ("MAX_BODY_BYTES", "1_048_576", "max_body_bytes", 1 << 20),
    (
        "MAX_BODY_BYTES_IN_FLIGHT",
        "",
        "max_body_bytes_in_flight",
        16 * settings.DEFAULT_MAX_BODY_BYTES,
    ),
    ("MAX_BODY_BYTES_IN_FLIGHT", "67108864", "max_body_bytes_in_flight", 1 << 26),
    ("MAX_INPUT_CHARS", "", "max_input_chars", settings.DEFAULT_MAX_INPUT_CHARS),
    ("MAX_INPUT_CHARS", "1", "max_input_chars", 1),
    (
        "MAX_REQUEST_CHARS",
        "",
        "max_request_chars",
        4 * settings.DEFAULT_MAX_INPUT_CHARS,
    ),
    ("MAX_REQUEST_CHARS", "2000", "max_request_chars", 2000),
    ("MAX_JSON_DEPTH", "", "max_json_depth", settings.DEFAULT_MAX_JSON_DEPTH),
    ("MAX_JSON_DEPTH", " 8 ", "max_json_depth", 8),
    ("MIN_OPTION_MASS", "", "min_option_mass", 0.5),
    ("MIN_OPTION_MASS", "0", "min_option_mass", 0.0),
    ("MIN_OPTION_MASS", "1", "min_option_mass", 1.0),
    ("CALIBRATION", "bundled", "calibration", "on"),
    ("CALIBRATION", " Yes ", "calibration", "on"),
    ("CALIBRATION", "1", "calibration", "on"),
    ("CALIBRATION", "", "calibration", "off"),
    ("CALIBRATION", "no", "calibration", "off"),
    ("CALIBRATION", "OFF", "calibration", "off"),
    ("CALIBRATION_DIR", " /srv/calibration ", "calibration_dir", "/srv/calibration"),
    ("STARTUP_WAIT", "", "startup_wait", settings.DEFAULT_STARTUP_WAIT),
    ("STARTUP_WAIT", "30", "startup_wait", 30.0),
    ("DEBIAS", "off", "debias", settings.NO_DEBIAS),
    ("DEBIAS", " ROTATE ", "debias", Debias("rotate")),
    ("DEBIAS", "rotate : 3", "debias", Debias("rotate", 3)),
    ("BULK_IN_FLIGHT", "", "bulk_in_flight", 256),
    ("BULK_IN_FLIGHT", "16", "bulk_in_flight", 16),
    ("BULK_WINDOW", "", "bulk_window", 4096),
    ("BULK_WINDOW", "1", "bulk_window", 1),
    ("PRIOR", "", "prior", "auto"),
    ("PRIOR", " Content-Free+Fitted ", "prior", "content-free+fitted"),
    ("PRIOR", "off", "prior", "off"),
    ("PRIOR_CACHE", "", "prior_cache", 4096),
    ("PRIOR_CACHE", "1", "prior_cache", 1),
    ("PRIOR_CACHE_BYTES", "", "prior_cache_bytes", 64 * 1024 * 1024),
    ("PRIOR_CACHE_BYTES", "65536", "prior_cache_bytes", 65536),
    ("MAX_ADAPTERS", "", "max_adapters", 16),
    ("FIRST_PASS", "", "first_pass", True),
    ("FIRST_PASS", " Off ", "first_pass", False),
    ("MAX_ADAPTERS", " 2 ", "max_adapters", 2),
    ("PRECISION", "", "precision", {}),
    ("PRECISION", " 0.9 ", "precision", {"*": 0.9}),
    (
        "PRECISION",
        "noul = 0.95, choice=0.8",
        "precision",
        {"noul": 0.95, "choice": 0.8},
    ),
    ("LABELS", "", "labels", ""),
    ("LABELS", "  ", "labels", ""),
    ("EXAMPLES", "", "examples", 4),
    ("EXAMPLES", " 0 ", "examples", 0),
    ("EXAMPLES", "8", "examples", 8),
]

# (variable, value, part of the message that says what is accepted)
REFUSED = [
    ("BACKEND", "logit:samples", "expected name or name:key=value"),
    ("BACKEND", "logit:=5", "expected name or name:key=value"),
    ("TEMPERATURE", "warm", "a finite number above 0, or empty for none"),
    ("TEMPERATURE", "0", "a finite number above 0"),
    ("TEMPERATURE", "-1", "a finite number above 0"),
    ("TEMPERATURE", "nan", "a finite number above 0"),
    ("TEMPERATURE", "inf", "a finite number above 0"),
    ("TEMPERATURE", "5e-324", "outside 0.001 to 1000.0"),
    ("TEMPERATURE", "2000", "outside 0.001 to 1000.0"),
    ("MIN_TEMPERATURE", "0", "a number from 0.000001 to 1"),
    ("MIN_TEMPERATURE", "1e-310", "a number from 0.000001 to 1"),
    ("MIN_TEMPERATURE", "2", "a number from 0.000001 to 1"),
    ("MIN_TEMPERATURE", "nan", "a number from 0.000001 to 1"),
    ("MAX_TEMPERATURE", "0.5", "a number from 1 to 1000000"),
    ("MAX_TEMPERATURE", "inf", "a number from 1 to 1000000"),
    (
        "MAX_QUESTIONS",
        "many",
        "a whole number of at least 1, or empty for the default, 64",
    ),
    ("MAX_QUESTIONS", "0", "a whole number of at least 1"),
    ("MAX_QUESTIONS", "1.5", "a whole number of at least 1"),
    ("MAX_QUESTIONS", "1e3", "a whole number of at least 1"),
    (
        "MAX_QUESTIONS",
        "9" * 5000,
        "a whole number of at least 1",
    ),  # past int()'s digit limit
    ("MAX_CHOICES", "1", "a whole number of at least 2, or empty for the default, 255"),
    ("MAX_LEVELS", "ten", "a whole number of at least 2"),
    ("MAX_BODY_BYTES", "32MB", "a whole number of at least 1024"),
    ("MAX_BODY_BYTES", "1000", "a whole number of at least 1024"),
    (
        "MAX_BODY_BYTES_IN_FLIGHT",
        "4194304",
        "at least 4/3 of VLLM_TYPED_DECISIONS_MAX_BODY_BYTES",
    ),
    ("MAX_INPUT_CHARS", "-1", "a whole number of at least 1"),
    (
        "MAX_REQUEST_CHARS",
        "0",
        "a whole number of at least 1, or empty for the default, 4000000",
    ),
    (
        "MAX_JSON_DEPTH",
        "deep",
        "a whole number of at least 1, or empty for the default, 800",
    ),
    ("MIN_OPTION_MASS", "half", "a number from 0 to 1, or empty for the default, 0.5"),
    ("MIN_OPTION_MASS", "1.5", "a number from 0 to 1"),
    ("MIN_OPTION_MASS", "nan", "a number from 0 to 1"),
    (
        "CALIBRATION",
        "of",
        "expected 1, true, yes or on .* or the path of a question file",
    ),
    (
        "CALIBRATION",
        "/no/such/questions.jsonl",
        "or the path of a question file, and no such file exists",
    ),
    (
        "STARTUP_WAIT",
        "soon",
        "a finite number above 0, or empty for the default, 900.0",
    ),
    ("STARTUP_WAIT", "0", "a finite number above 0"),
    ("DEBIAS", "sideways", "expected off, rotate or rotate:N with N >= 1"),
    (
        "BULK_IN_FLIGHT",
        "0",
        "a whole number of at least 1, or empty for the default, 256",
    ),
    (
        "BULK_WINDOW",
        "lots",
        "a whole number of at least 1, or empty for the default, 4096",
    ),
    ("DEBIAS", "rotate:0", "expected off, rotate or rotate:N"),
    ("DEBIAS", "rotate:²", "expected off, rotate or rotate:N"),  # a digit int() refuses
    ("DEBIAS", "off:2", "expected off, rotate or rotate:N"),
    (
        "PRIOR",
        "content",
        "expected one of auto, off, content-free, fitted, content-free\\+fitted, or empty for auto",
    ),
    (
        "PRIOR_CACHE",
        "0",
        "a whole number of at least 1, or empty for the default, 4096",
    ),
    (
        "PRIOR_CACHE_BYTES",
        "64MB",
        "a whole number of at least 65536, or empty for the default, 67108864",
    ),
    ("MAX_ADAPTERS", "0", "a whole number of at least 1, or empty for the default, 16"),
    ("FIRST_PASS", "later", "expected 1, true, yes or on to switch on"),
    ("PRECISION", "1", "expected a precision between 0 and 1"),
    ("PRECISION", "0", "expected a precision between 0 and 1"),
    ("PRECISION", "high", "expected a precision between 0 and 1"),
    ("PRECISION", "noul=2", "expected a precision between 0 and 1"),
    ("PRECISION", "noul=0.9,noul=0.8", "each type once"),
    ("PRECISION", "0.9,noul=0.8", "one precision for every type, or one per type"),
    ("LABELS", "/no/such/labels.jsonl", "no such file exists"),
    ("EXAMPLES", "-1", "a whole number of at least 0, or empty for the default, 4"),
    ("EXAMPLES", "some", "a whole number of at least 0, or empty for the default, 4"),
]


@pytest.mark.parametrize(("variable", "value", "field", "expected"), LENIENT)
def test_lenient_values(variable, value, field, expected):
    assert read(variable, value, field) == expected


@pytest.mark.parametrize(("variable", "value", "accepted"), REFUSED)
def test_refused_values_name_the_variable_and_what_it_accepts(
    variable, value, accepted
):
    with pytest.raises(
        SettingsError, match=rf"^{PREFIX}{variable}=.*{accepted}"
    ) as refused:
        Settings.from_env({PREFIX + variable: value})
    assert "\n" not in str(refused.value)


def test_prior_words_are_the_corrections_and_auto():
    from vllm.entrypoints.generate.decisions.decide.settings import (
        AUTO,
        MODES,
    )

    assert (AUTO, *MODES) == settings.PRIOR_CHOICES


def test_every_variable_is_covered_here():
    assert {PREFIX + v for v, *_ in LENIENT} | {ENABLE_VARIABLE} == set(VARIABLES)
    # CALIBRATION_DIR takes any path; whether it is writable is found (and logged) when a result is saved.
    assert {PREFIX + v for v, *_ in REFUSED} == set(VARIABLES) - {
        ENABLE_VARIABLE,
        PREFIX + "CALIBRATION_DIR",
    }


def test_the_request_budget_follows_the_input_limit_unless_set():
    env = {PREFIX + "MAX_INPUT_CHARS": "1000"}
    assert Settings.from_env(env).max_request_chars == 4000
    assert (
        Settings.from_env(
            {**env, PREFIX + "MAX_REQUEST_CHARS": "1500"}
        ).max_request_chars
        == 1500
    )
    with pytest.raises(settings.SettingsError, match="empty for the default, 4000"):
        Settings.from_env({**env, PREFIX + "MAX_REQUEST_CHARS": "many"})


def test_defaults_where_unset():
    unset = Settings.from_env({})
    assert (unset.calibration, unset.debias, unset.startup_wait) == (
        "on",
        settings.DEFAULT_DEBIAS,
        900.0,
    )
    assert unset.calibration_dir.endswith("decisions-calibration")


def test_the_configuration_page_gives_the_defaults_from_env_applies(monkeypatch):
    """docs/configuration.md's table of variables shows each default; from_env is where they are written, so
    every written-out default there must be what an unset variable reads as."""
    monkeypatch.undo()  # the real debias default, not the unit tests' single reads
    page = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    unset = Settings.from_env({"HF_HOME": "/hf"})
    checked = set()
    for variable, default in re.findall(
        r"^\| `([A-Z_]+)` \| `([^`|]+)` \|", page, re.M
    ):
        value = getattr(unset, variable.removeprefix(PREFIX).lower())
        if isinstance(value, bool):
            value = "on" if value else "off"
        if isinstance(value, int | float):
            assert float(default) == value, variable
        else:
            assert default.replace("$HF_HOME", "/hf") == str(value), variable
        checked.add(variable)
    # The rest show it in words: off (the switch), (auto), (unset), 4 x MAX_INPUT_CHARS.
    assert set(VARIABLES) - checked == {
        ENABLE_VARIABLE,
        PREFIX + "BACKEND",
        PREFIX + "TEMPERATURE",
        PREFIX + "MAX_REQUEST_CHARS",
        PREFIX + "PRECISION",
        PREFIX + "LABELS",
    }


def test_a_calibration_file_that_exists_is_taken_as_is(tmp_path):
    questions = tmp_path / "questions.jsonl"
    questions.write_text("")
    assert read("CALIBRATION", f" {questions} ", "calibration") == str(questions)


def test_a_labels_file_that_exists_is_taken_as_is(tmp_path):
    labels = tmp_path / "labels.jsonl"
    labels.write_text("")
    assert read("LABELS", f" {labels} ", "labels") == str(labels)


def test_check_environment_reads_settings_only_when_decisions_are_on():
    bad = {PREFIX + "MAX_CHOICES": "lots"}
    assert check_environment({ENABLE_VARIABLE: "", **bad}) is None
    with pytest.raises(SettingsError, match=f"{PREFIX}MAX_CHOICES='lots'"):
        check_environment({ENABLE_VARIABLE: "true", **bad})
    assert isinstance(check_environment({ENABLE_VARIABLE: "on"}), Settings)


# --- vLLM's side, as the router patch installs it -------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch):
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


@pytest.mark.parametrize("value", [*ON, *OFF, *NOT_SWITCHES])
def test_vllm_envs_reads_the_switch_without_raising(clean_env, value):
    """Engine processes evaluate every vllm/envs.py variable (enable_envs_cache): none may raise there."""
    import vllm.envs

    clean_env.setenv(ENABLE_VARIABLE, value)
    assert vllm.envs.environment_variables[ENABLE_VARIABLE]() is (value in ON)
    for variable in VARIABLES[1:]:
        clean_env.setenv(variable, value)
    # the settings are declared by prefix, as vllm/envs.py finds them at import
    envs = fresh_vllm_envs()
    for variable in VARIABLES[1:]:
        assert envs.environment_variables[variable]() == value


@pytest.fixture(scope="module")
def serve_args():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser()).parse_args


def test_vllm_serve_argument_check_refuses_a_bad_value_before_the_engine(
    clean_env, serve_args
):
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    args = serve_args(["--model", "m"])
    validate_parsed_serve_args(args)  # unset: stock vLLM, our package not even read
    for value in ("", "true", " No "):
        clean_env.setenv(ENABLE_VARIABLE, value)
        validate_parsed_serve_args(args)
    clean_env.setenv(ENABLE_VARIABLE, "maybe")
    with pytest.raises(SettingsError, match=f"{ENABLE_VARIABLE}='maybe'"):
        validate_parsed_serve_args(args)
    clean_env.setenv(ENABLE_VARIABLE, "1")
    clean_env.setenv(PREFIX + "DEBIAS", "sideways")
    with pytest.raises(SettingsError, match=f"{PREFIX}DEBIAS='sideways'"):
        validate_parsed_serve_args(args)
    # A headless engine serves no routes: our variables are not its business.
    validate_parsed_serve_args(serve_args(["--model", "m", "--headless"]))
