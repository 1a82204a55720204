# SPDX-License-Identifier: Apache-2.0
"""One exception for every refusal, carrying the HTTP status the wire layers report."""

from __future__ import annotations

import re
from http import HTTPStatus


class DecisionError(Exception):
    """A question or request that can't be answered, and why.

    ``status`` is the HTTP status for the failure: 400 for a request that breaks a rule (the Jev
    wire reports those as 422), 503 while the server can't answer decisions, 500 for a fault.
    """

    # Seconds a client should wait before retrying (sent as Retry-After), for temporary refusals.
    retry_after: int | None = None

    def __init__(
        self,
        message: str,
        status: HTTPStatus = HTTPStatus.BAD_REQUEST,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        # The request field at fault, where vLLM's error response names one (``model`` for an unknown model).
        self.param = param

    @property
    def is_invalid_input(self) -> bool:
        return self.status == HTTPStatus.BAD_REQUEST


class OverLimitError(DecisionError):
    """A request over a configured limit (or the model's context): a 400 like any broken rule, told
    apart only so the decision metrics can count it as ``over_limit`` (metrics.py)."""


STARTING = "decisions are starting"


class NotReadyError(DecisionError):
    """Startup work (self-check, calibration) has not finished; the client should retry. The message says
    which step is running and how far along it is (serving/readiness.py); ``retry_after`` fits the time left."""

    def __init__(
        self, message: str = f"{STARTING}; retry shortly", retry_after: int = 5
    ) -> None:
        super().__init__(message, HTTPStatus.SERVICE_UNAVAILABLE)
        self.retry_after = retry_after


class EngineBusyError(DecisionError):
    """The engine refused a read because its queue is full (``--max-num-queued-reqs`` or
    ``--max-num-queued-tokens``); the whole request is refused, and the client should retry."""

    retry_after = 1

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"the engine is at its queue limit ({reason}); retry shortly",
            HTTPStatus.SERVICE_UNAVAILABLE,
        )


# The most characters of one client value that an error message quotes.
SHOWN_CHARS = 64


def shown(value: object, limit: int = SHOWN_CHARS, bare: bool = False) -> str:
    """``value`` as an error message quotes it: its ``repr()`` (with ``bare``, a string as it is, for
    a field path or an id); a longer one only as a prefix and its length, ``'abc…' (1048576
    characters)``, since a client's value may be megabytes long and a message must stay short."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value if bare else repr(value)
        quoted = repr(value[:limit])
        return f"{quoted[:-1]}…{quoted[-1]} ({len(value)} characters)"
    try:
        text = repr(value)
    except RecursionError:  # a JSON value nested as deep as the parser allows
        text = f"<a deeply nested {type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


class BackendUnavailable(RuntimeError):
    """A backend can't serve the model it was started on; the message says why (and what to change)."""


# An absolute local path (POSIX, home-relative or Windows), as exception texts and some messages hold them.
LOCAL_PATH = re.compile(
    r"(?:(?<![\w.:/])~?/(?:[^\s/'\"(),;:]+/)+[^\s/'\"(),;:]*|\b[A-Za-z]:\\[^\s'\"(),;]+)"
)


def without_paths(message: str) -> str:
    """``message`` with every absolute local path left out: a response names what to change, and the
    server's log (with the request id) keeps where."""
    return LOCAL_PATH.sub("<path>", message)


def internal_error(reference: str) -> DecisionError:
    """A fault of the server's, as a client sees it: no exception text; the log has it, under
    ``reference`` (the request id, or the engine request id that holds it)."""
    return DecisionError(
        f"internal error; the server's log has the details (look for {reference})",
        HTTPStatus.INTERNAL_SERVER_ERROR,
    )
