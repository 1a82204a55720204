# SPDX-License-Identifier: Apache-2.0
"""Every setting of the decision endpoints, read from the environment once, at startup.

A bad value stops the server naming the variable and what it accepts; the router patch calls
:func:`check_environment` before the engine starts, so a typo costs seconds, not a model load. An empty
value means the default; for a switch, off (the usual way to switch a variable off in an env file)."""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar, get_args

# The prior corrections (reading/prior.py); auto: calibration's choice per question type.
PriorMode = Literal["off", "content-free", "fitted", "content-free+fitted"]
PriorSetting = Literal["auto", PriorMode]
MODES: tuple[PriorMode, ...] = get_args(PriorMode)
PRIOR_CHOICES: tuple[PriorSetting, ...] = get_args(PriorSetting)
AUTO: PriorSetting = "auto"


def uses_content_free(mode: str) -> bool:
    return mode.startswith("content-free")


def uses_fitted(mode: str) -> bool:
    return mode.endswith("fitted")


PREFIX = "VLLM_TYPED_DECISIONS_"
ENABLE_VARIABLE = "VLLM_ENABLE_TYPED_DECISIONS"

W = TypeVar("W", bound=str)

SWITCH_ON = ("1", "true", "yes", "on")
SWITCH_OFF = ("0", "false", "no", "off", "")
SWITCH_WORDS = (
    "1, true, yes or on to switch on; 0, false, no, off or empty to switch off"
)

# A decision request is an input and its questions: a few MiB hold any context a model has today.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
# Bodies of 64 KiB and up may hold 3/4 of the bytes in flight (http/wire/body.py): twelve at the limit.
BODIES_IN_FLIGHT_PER_BODY = 16
DEFAULT_MAX_INPUT_CHARS = 1_000_000
# The longest input and three times its length in questions: more than any model's context today.
REQUEST_CHARS_PER_INPUT = 4
# Above the deepest value DEFAULT_MAX_INPUT_CHARS holds indented (about 707: d deep renders to about
# 2 * d**2 characters), below where Python's recursion runs out (the body parser refuses about 1,000).
DEFAULT_MAX_JSON_DEPTH = 800
DEFAULT_STARTUP_WAIT = 900.0
DEFAULT_PRIOR_CACHE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_ADAPTERS = 16
# Wide enough for any real fit (calibration searches 0.05 to 20); no score divided by one overflows.
DEFAULT_MIN_TEMPERATURE = 0.001
DEFAULT_MAX_TEMPERATURE = 1000.0


class SettingsError(ValueError):
    """A setting with a value the server can't use; the message names the variable."""


def parse_switch(name: str, raw: str | None) -> bool:
    """vllm/envs.py (the router patch) reads VLLM_ENABLE_TYPED_DECISIONS with the same words but takes
    any other value as off rather than fail in an engine process; this is where such a value is refused."""
    word = (raw or "").strip().lower()
    if word in SWITCH_ON:
        return True
    if word in SWITCH_OFF:
        return False
    raise SettingsError(f"{name}={raw!r}: expected {SWITCH_WORDS}")


@dataclass(frozen=True)
class BackendSpec:
    """``name:arg=value,arg=value`` split into the backend's name and typed arguments."""

    name: str | None
    args: Mapping[str, Any]


@dataclass(frozen=True)
class Debias:
    """``off`` (one read in the client's order) or ``rotate`` (``rotations``: None for the default)."""

    mode: str = "off"
    rotations: int | None = None

    def __str__(self) -> str:
        return self.mode if self.rotations is None else f"{self.mode}:{self.rotations}"


NO_DEBIAS = Debias()
DEBIAS_FORMS = "off, rotate or rotate:N with N >= 1"


def parse_debias(text: str, exact: bool = False) -> Debias:
    """In any case and spacing, or when ``exact`` (a request's ``extra.debias``) spelled as str() spells
    the result; ValueError naming the accepted forms otherwise."""
    mode, sep, count = (part.strip() for part in text.strip().lower().partition(":"))
    parsed = None
    if mode == "off" and not sep:
        parsed = NO_DEBIAS
    # isdecimal, not isdigit: "²" is a digit that int() refuses.
    elif mode == "rotate" and (not sep or (count.isdecimal() and int(count) >= 1)):
        parsed = Debias("rotate", int(count) if sep else None)
    if parsed is None or (exact and str(parsed) != text):
        raise ValueError(f"{text!r}: expected {DEBIAS_FORMS}")
    return parsed


DEFAULT_DEBIAS = Debias("rotate", 1)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The values in force, one per variable in VARIABLES' order; each default is written once, where
    :meth:`from_env` reads its variable."""

    backend: BackendSpec
    temperature: float | None
    # The temperatures that may apply (a request's, the configured one, a saved calibration's).
    min_temperature: float
    max_temperature: float
    max_questions: int
    max_choices: int
    max_levels: int
    max_body_bytes: int
    # The request-body bytes one API-server process holds at once, received or decoded (body.py).
    max_body_bytes_in_flight: int
    # The longest input (state) text, in characters, after input items are rendered to text.
    max_input_chars: int
    # One budget per request (budget.py).
    max_request_chars: int
    max_json_depth: int
    min_option_mass: float
    # "off", "on" (the bundled question set) or the path of an operator question file.
    calibration: str
    calibration_dir: str
    # Whether a fresh calibration answers after a smaller first pass while the full one runs on.
    first_pass: bool
    # Seconds an API-server process waits for another one's startup work before doing it itself.
    startup_wait: float
    debias: Debias
    # vllm run-batch: the most lines in flight, and the most read ahead to group lines about one input.
    bulk_in_flight: int
    bulk_window: int
    # The content-free reads kept per decision service: how many questions' and in how much memory.
    prior: PriorSetting
    prior_cache: int
    prior_cache_bytes: int
    # LoRA adapters with a decision service of their own at once: least recently used out (adapters.py).
    max_adapters: int
    # The precision each question type's answers should reach ("*": every type's); empty: none asked.
    precision: Mapping[str, float] = field(default_factory=dict)
    # The labels file the server watches while serving ("": none; calibration/live_labels.py).
    labels: str = ""
    # The most labelled inputs a labelled question is asked with ahead of its input; 0: none.
    examples: int = 4

    def temperature_problem(self, value: float) -> str | None:
        if self.min_temperature <= value <= self.max_temperature:
            return None
        return (
            f"{value!r} is outside the temperatures this server applies, {self.min_temperature!r} to "
            f"{self.max_temperature!r} ({PREFIX}MIN_TEMPERATURE and {PREFIX}MAX_TEMPERATURE set the range)"
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        max_input_chars = _int_at_least(
            env, "MAX_INPUT_CHARS", DEFAULT_MAX_INPUT_CHARS, 1
        )
        low, high = _temperature_range(env)
        max_body_bytes = _int_at_least(
            env, "MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, 1024
        )
        in_flight = _int_at_least(
            env,
            "MAX_BODY_BYTES_IN_FLIGHT",
            BODIES_IN_FLIGHT_PER_BODY * max_body_bytes,
            1024,
        )
        # a body at the limit must fit in the three quarters large bodies share
        if in_flight * 3 < max_body_bytes * 4:
            raise SettingsError(
                f"{PREFIX}MAX_BODY_BYTES_IN_FLIGHT={in_flight}: at least 4/3 of {PREFIX}MAX_BODY_BYTES "
                f"({max_body_bytes}) is needed, so that a body at that limit can be taken"
            )
        temperature = _positive_float(env, "TEMPERATURE")
        if temperature is not None and not low <= temperature <= high:
            raise SettingsError(
                f"{PREFIX}TEMPERATURE={temperature!r}: outside {low!r} to {high!r}, the range "
                f"{PREFIX}MIN_TEMPERATURE and {PREFIX}MAX_TEMPERATURE set"
            )
        return cls(
            backend=parse_backend_spec(env.get(PREFIX + "BACKEND", "")),
            temperature=temperature,
            max_questions=_int_at_least(env, "MAX_QUESTIONS", 64, 1),
            max_choices=_int_at_least(env, "MAX_CHOICES", 255, 2),
            max_levels=_int_at_least(env, "MAX_LEVELS", 10, 2),
            max_body_bytes=max_body_bytes,
            max_body_bytes_in_flight=in_flight,
            max_input_chars=max_input_chars,
            min_option_mass=_fraction(env, "MIN_OPTION_MASS", 0.5),
            calibration=_calibration(env),
            calibration_dir=env.get(PREFIX + "CALIBRATION_DIR", "").strip()
            or default_calibration_dir(env),
            startup_wait=_positive_float(env, "STARTUP_WAIT", DEFAULT_STARTUP_WAIT),
            debias=_debias(env),
            bulk_in_flight=_int_at_least(env, "BULK_IN_FLIGHT", 256, 1),
            bulk_window=_int_at_least(env, "BULK_WINDOW", 4096, 1),
            prior=_choice(env, "PRIOR", PRIOR_CHOICES, AUTO),
            prior_cache=_int_at_least(env, "PRIOR_CACHE", 4096, 1),
            prior_cache_bytes=_int_at_least(
                env, "PRIOR_CACHE_BYTES", DEFAULT_PRIOR_CACHE_BYTES, 65536
            ),
            max_adapters=_int_at_least(env, "MAX_ADAPTERS", DEFAULT_MAX_ADAPTERS, 1),
            first_pass=parse_switch(
                PREFIX + "FIRST_PASS",
                env.get(PREFIX + "FIRST_PASS", "").strip() or "on",
            ),
            max_request_chars=_int_at_least(
                env, "MAX_REQUEST_CHARS", REQUEST_CHARS_PER_INPUT * max_input_chars, 1
            ),
            max_json_depth=_int_at_least(
                env, "MAX_JSON_DEPTH", DEFAULT_MAX_JSON_DEPTH, 1
            ),
            min_temperature=low,
            max_temperature=high,
            precision=_precision(env),
            labels=_labels(env),
            examples=_int_at_least(env, "EXAMPLES", 4, 0),
        )


# Every name this module reads. The router patch declares every VLLM_TYPED_DECISIONS_* name the
# environment holds in vllm/envs.py; check_environment refuses one not listed here.
VARIABLES = (ENABLE_VARIABLE, *(PREFIX + f.name.upper() for f in fields(Settings)))


def decisions_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether VLLM_ENABLE_TYPED_DECISIONS switches the decision endpoints on; SettingsError if unreadable."""
    env = os.environ if environ is None else environ
    return parse_switch(ENABLE_VARIABLE, env.get(ENABLE_VARIABLE))


def check_environment(environ: Mapping[str, str] | None = None) -> Settings | None:
    """The settings when decisions are on, None when off; SettingsError for a bad value or an unknown
    name. The backend is checked at startup, once plugins are loaded."""
    env = os.environ if environ is None else environ
    if not decisions_enabled(env):
        return None
    if unknown := unknown_variables(env):
        raise SettingsError(unknown_message(unknown[0]))
    return Settings.from_env(env)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """Names under our prefix that no setting reads, in sorted order: most likely typos."""
    return sorted(
        name for name in environ if name.startswith(PREFIX) and name not in VARIABLES
    )


def unknown_message(name: str) -> str:
    """What a name no setting reads is, the setting it most likely meant, and the names there are."""
    close = difflib.get_close_matches(name, VARIABLES[1:], n=1)
    meant = f" (did you mean {close[0]}?)" if close else ""
    names = ", ".join(variable.removeprefix(PREFIX) for variable in VARIABLES[1:])
    return f"{name} is not a setting of the decision endpoints{meant}; the settings are {PREFIX}{{{names}}}"


def parse_value(text: str) -> int | float | bool | str:
    """A backend argument: int, float or bool when it reads as one, else the string itself."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        with suppress(ValueError):
            return convert(text)
    return text


def parse_backend_spec(text: str) -> BackendSpec:
    text = text.strip()
    if not text:
        return BackendSpec(None, {})
    name, _, arg_text = text.partition(":")
    args: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in arg_text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SettingsError(
                f"{PREFIX}BACKEND={text!r}: argument {item!r} is not key=value; "
                "expected name or name:key=value,key=value"
            )
        args[key.strip()] = parse_value(value.strip())
    return BackendSpec(name.strip(), args)


def _number(
    env: Mapping[str, str],
    key: str,
    kind: type[int] | type[float],
    default: Any,
    valid: Callable[[float], bool],
    accepted: str,
) -> Any:
    """Variable PREFIX + ``key``: its default when unset or empty, else its value if ``valid``."""
    name = PREFIX + key
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = kind(raw)
    except ValueError:  # int() and float() of any text raise nothing else
        value = None
    if value is None or not valid(value):
        empty = "none" if default is None else f"the default, {default}"
        raise SettingsError(
            f"{name}={raw!r}: expected {accepted}, or empty for {empty}"
        )
    return value


def _int_at_least(env: Mapping[str, str], key: str, default: int, minimum: int) -> int:
    accepted = f"a whole number of at least {minimum}"
    return _number(env, key, int, default, lambda v: v >= minimum, accepted)


def _positive_float(
    env: Mapping[str, str], key: str, default: float | None = None
) -> Any:
    return _number(
        env, key, float, default, lambda v: 0 < v < math.inf, "a finite number above 0"
    )


def _fraction(env: Mapping[str, str], key: str, default: float) -> float:
    return _number(
        env, key, float, default, lambda v: 0.0 <= v <= 1.0, "a number from 0 to 1"
    )


def _temperature_range(env: Mapping[str, str]) -> tuple[float, float]:
    low = _number(
        env,
        "MIN_TEMPERATURE",
        float,
        DEFAULT_MIN_TEMPERATURE,
        lambda v: 1e-6 <= v <= 1.0,
        "a number from 0.000001 to 1 (1.0 is the default temperature)",
    )
    high = _number(
        env,
        "MAX_TEMPERATURE",
        float,
        DEFAULT_MAX_TEMPERATURE,
        lambda v: 1.0 <= v <= 1e6,
        "a number from 1 to 1000000 (1.0 is the default temperature)",
    )
    return low, high


def _precision(env: Mapping[str, str]) -> dict[str, float]:
    """``0.9`` (every question type) or ``noul=0.95,choice=0.8``."""
    name = PREFIX + "PRECISION"
    text = env.get(name, "").strip()
    asked: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, value = part.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not 0.0 < number < 1.0 or kind.strip() in asked or (not kind and asked):
            raise SettingsError(
                f"{name}={text!r}: expected a precision between 0 and 1 for every question type "
                "(0.9), or one per type (noul=0.95,choice=0.8), each type once"
            )
        asked[kind.strip() or "*"] = number
    if "*" in asked and len(asked) > 1:
        raise SettingsError(
            f"{name}={text!r}: one precision for every type, or one per type, not both"
        )
    return asked


def _labels(env: Mapping[str, str]) -> str:
    """Empty, or a labels file that exists now: a path naming nothing is far more likely a typo than a
    file yet to appear."""
    name = PREFIX + "LABELS"
    raw = env.get(name, "")
    text = raw.strip()
    if text and not os.path.isfile(text):
        raise SettingsError(
            f"{name}={raw!r}: expected the path of a labels file (the calibration question "
            "format), or empty for none, and no such file exists"
        )
    return text


def _debias(env: Mapping[str, str]) -> Debias:
    name = PREFIX + "DEBIAS"
    raw = env.get(name, "").strip()
    if not raw:
        return DEFAULT_DEBIAS
    try:
        return parse_debias(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={exc}") from None


def _choice(env: Mapping[str, str], key: str, accepted: tuple[W, ...], default: W) -> W:
    """One word of ``accepted`` (any case), or the default when unset or empty."""
    name = PREFIX + key
    raw = env.get(name, "")
    word = raw.strip().lower()
    if not word:
        return default
    for choice in accepted:
        if word == choice:
            return choice
    raise SettingsError(
        f"{name}={raw!r}: expected one of {', '.join(accepted)}, or empty for {default}"
    )


def default_calibration_dir(env: Mapping[str, str]) -> str:
    """Under $HF_HOME, which survives container rebuilds when the Hugging Face cache is mounted."""
    hf_home = env.get("HF_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache", "huggingface"
    )
    return os.path.join(hf_home, "decisions-calibration")


def _calibration(env: Mapping[str, str]) -> str:
    """A switch (unset: on, the bundled set) or a question file that exists now: a word that is neither
    is far more likely a typo than a file yet to appear."""
    name = PREFIX + "CALIBRATION"
    raw = env.get(name)
    if raw is None or raw.strip().lower() == "bundled":
        return "on"
    text = raw.strip()
    try:
        return "on" if parse_switch(name, text) else "off"
    except SettingsError:
        if os.path.isfile(text):
            return text
    raise SettingsError(
        f"{name}={raw!r}: expected {SWITCH_WORDS} (on: the bundled question set), "
        "or the path of a question file, and no such file exists"
    )
