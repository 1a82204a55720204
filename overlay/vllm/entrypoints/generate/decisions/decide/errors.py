# SPDX-License-Identifier: Apache-2.0
"""One exception for every refusal, carrying the HTTP status the wire layers report."""

from __future__ import annotations

import re
from http import HTTPStatus


class DecisionError(Exception):
    """``status``: 400 for a broken rule (the Jev wire reports 422), 503 while the server can't
    answer, 500 for a fault."""

    # Sent as Retry-After, for temporary refusals.
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
        # The request field vLLM's error response names (``model`` for an unknown model).
        self.param = param


class OverLimitError(DecisionError):
    """Over a configured limit or the context: a 400, told apart for the ``over_limit`` metric."""


STARTING = "decisions are starting"


class NotReadyError(DecisionError):
    """Startup work (self-check, calibration) has not finished; the client should retry."""

    def __init__(
        self, message: str = f"{STARTING}; retry shortly", retry_after: int = 5
    ) -> None:
        super().__init__(message, HTTPStatus.SERVICE_UNAVAILABLE)
        self.retry_after = retry_after


class EngineBusyError(DecisionError):
    """The engine's queue is full (``--max-num-queued-reqs`` / ``-tokens``); the client should retry."""

    retry_after = 1

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"the engine is at its queue limit ({reason}); retry shortly",
            HTTPStatus.SERVICE_UNAVAILABLE,
        )


# The most characters of one client value that an error message quotes.
SHOWN_CHARS = 64


def shown(value: object, limit: int = SHOWN_CHARS, bare: bool = False) -> str:
    """``value``'s ``repr()`` (``bare``: a string as it is), cut to a prefix and its length when
    long: a client's value may be megabytes long, and a message must stay short."""
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
    """A backend can't serve the model it was started on; the message says why."""


# An absolute local path (POSIX, home-relative or Windows), as exception texts and some messages hold them.
LOCAL_PATH = re.compile(
    r"(?:(?<![\w.:/])~?/(?:[^\s/'\"(),;:]+/)+[^\s/'\"(),;:]*|\b[A-Za-z]:\\[^\s'\"(),;]+)"
)


def without_paths(message: str) -> str:
    """``message`` without local paths: the server's log, not the response, says where."""
    return LOCAL_PATH.sub("<path>", message)


def internal_error(reference: str) -> DecisionError:
    """A server fault as a client sees it: no exception text; the log has it under ``reference``."""
    return DecisionError(
        f"internal error; the server's log has the details (look for {reference})",
        HTTPStatus.INTERNAL_SERVER_ERROR,
    )
