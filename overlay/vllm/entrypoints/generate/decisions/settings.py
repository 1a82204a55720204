# SPDX-License-Identifier: Apache-2.0
"""Every setting of the decision endpoints, read from the environment once, at startup.

A bad value stops the server with a message naming the variable, so a typo never turns into a
silently different behaviour. Limits live here too: each request check names the variable to raise.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "VLLM_TYPED_DECISIONS_"
ENABLE_VARIABLE = "VLLM_ENABLE_TYPED_DECISIONS"

# Names this module reads; the router patch declares every one in vllm/envs.py so that vLLM's
# environment validation knows them (tests/unit/test_settings.py holds the two lists together).
VARIABLES = (
    ENABLE_VARIABLE,
    PREFIX + "BACKEND",
    PREFIX + "TEMPERATURE",
    PREFIX + "MAX_QUESTIONS",
    PREFIX + "MAX_CHOICES",
    PREFIX + "MAX_LEVELS",
    PREFIX + "MAX_BODY_BYTES",
    PREFIX + "MAX_INPUT_CHARS",
    PREFIX + "MIN_OPTION_MASS",
    PREFIX + "CALIBRATION",
    PREFIX + "CALIBRATION_DIR",
    PREFIX + "STARTUP_WAIT",
    PREFIX + "DEBIAS",
)


DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_INPUT_CHARS = 1_000_000
DEFAULT_STARTUP_WAIT = 900.0


class SettingsError(ValueError):
    """A setting with a value the server can't use; the message names the variable."""


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


def parse_debias(text: str) -> Debias:
    """``off``, ``rotate`` or ``rotate:N`` (N >= 1); ValueError with the accepted forms otherwise."""
    mode, sep, count = text.strip().lower().partition(":")
    if mode == "off" and not sep:
        return NO_DEBIAS
    if mode == "rotate":
        if not sep:
            return Debias("rotate")
        if count.isdigit() and int(count) >= 1:
            return Debias("rotate", int(count))
    raise ValueError(f"{text!r}: expected off, rotate or rotate:N with N >= 1")


DEFAULT_DEBIAS = Debias("rotate")


@dataclass(frozen=True)
class Settings:
    backend: BackendSpec
    temperature: float | None
    max_questions: int
    max_choices: int
    max_levels: int
    max_body_bytes: int
    # The longest input (state) text, in characters, after input items are rendered to text.
    max_input_chars: int
    min_option_mass: float
    # "off", "on" (the bundled question set) or the path of an operator question file.
    calibration: str
    calibration_dir: str
    # Seconds an API-server process waits for another one's startup work before doing it itself.
    startup_wait: float
    # How answers are made independent of the clients' option order (debias.py).
    debias: Debias = DEFAULT_DEBIAS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        return cls(
            backend=parse_backend_spec(env.get(PREFIX + "BACKEND", "")),
            temperature=_positive_float(env, PREFIX + "TEMPERATURE"),
            max_questions=_int_at_least(env, PREFIX + "MAX_QUESTIONS", 64, 1),
            max_choices=_int_at_least(env, PREFIX + "MAX_CHOICES", 255, 2),
            max_levels=_int_at_least(env, PREFIX + "MAX_LEVELS", 10, 2),
            max_body_bytes=_int_at_least(env, PREFIX + "MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, 1024),
            max_input_chars=_int_at_least(env, PREFIX + "MAX_INPUT_CHARS", DEFAULT_MAX_INPUT_CHARS, 1),
            min_option_mass=_fraction(env, PREFIX + "MIN_OPTION_MASS", 0.5),
            calibration=_calibration(env),
            calibration_dir=env.get(PREFIX + "CALIBRATION_DIR") or default_calibration_dir(env),
            startup_wait=_positive_float(env, PREFIX + "STARTUP_WAIT") or DEFAULT_STARTUP_WAIT,
            debias=_debias(env),
        )


def parse_value(text: str) -> int | float | bool | str:
    """A backend argument: int, float or bool when it reads as one, else the string itself."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
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
            raise SettingsError(f"{PREFIX}BACKEND: argument {item!r} is not key=value")
        args[key.strip()] = parse_value(value.strip())
    return BackendSpec(name.strip(), args)


def _number(env: Mapping[str, str], name: str, kind: type[int] | type[float], default: Any,
            valid: Callable[[float], bool], rule: str) -> Any:  # fmt: skip
    """A numeric setting: its default when unset, else the parsed value if it keeps ``rule``."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected {'an integer' if kind is int else 'a number'}") from None
    if not valid(value):
        raise SettingsError(f"{name}={raw!r}: {rule}")
    return value


def _int_at_least(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    return _number(env, name, int, default, lambda v: v >= minimum, f"must be at least {minimum}")


def _positive_float(env: Mapping[str, str], name: str) -> float | None:
    return _number(env, name, float, None, lambda v: 0 < v < math.inf, "must be a positive finite number")


def _fraction(env: Mapping[str, str], name: str, default: float) -> float:
    return _number(env, name, float, default, lambda v: 0.0 <= v <= 1.0, "must be between 0 and 1")


def _debias(env: Mapping[str, str]) -> Debias:
    name = PREFIX + "DEBIAS"
    raw = env.get(name, "").strip()
    if not raw:
        return DEFAULT_DEBIAS
    try:
        return parse_debias(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={exc}") from None


def default_calibration_dir(env: Mapping[str, str]) -> str:
    """Under $HF_HOME, which survives container rebuilds when the Hugging Face cache is mounted."""
    hf_home = env.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(hf_home, "decisions-calibration")


def _calibration(env: Mapping[str, str]) -> str:
    name = PREFIX + "CALIBRATION"
    raw = (env.get(name) or "on").strip()
    if raw.lower() in ("on", "1", "true", "bundled"):
        return "on"
    if raw.lower() in ("off", "0", "false"):
        return "off"
    return raw  # a question file; whether it can be read is checked (with a warning) at calibration time
