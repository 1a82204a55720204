# SPDX-License-Identifier: Apache-2.0
"""``--api-key`` on the decision paths: vLLM's own check, answered in each wire's error shape.

vLLM's authentication middleware answers a bad key on ``/v1/...`` paths itself, as
``{"error": "Unauthorized"}``, which is neither OpenAI's error shape nor Jev's, and leaves
``/api/alpha/decisions`` open. With typed decisions enabled, vLLM installs this subclass instead
(patches/api-router-wire): on a decision path that one of the decision routes answers, it only records
its verdict in the request scope, and that route (routing.py) refuses in the wire's shape. Anywhere else
it is vLLM's check, so a path is never let through to a handler that does not refuse (vLLM 0.32's own
``/v1/systemone``, if it were the one to answer).
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.datastructures import Headers
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

from .paths import DECISION_PATHS

# The request scope key holding the verdict: True or False when a key is required, absent otherwise.
AUTHORIZED = "vllm.decisions.authorized"


def answered_by_decision_route(scope: Scope) -> bool:
    """Whether the route that will answer this request is a decision route, which refuses a bad key
    itself: the first route matching it fully, as Starlette's router picks."""
    app = scope.get("app")
    for route in getattr(getattr(app, "router", None), "routes", ()):
        if route.matches(scope)[0] is Match.FULL:
            return bool(getattr(route, "checks_decision_authorization", False))  # routing.py
    return False


class DecisionAuthentication(AuthenticationMiddleware):
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        if scope["type"] == "http" and path in DECISION_PATHS and answered_by_decision_route(scope):
            scope[AUTHORIZED] = scope.get("method") == "OPTIONS" or self.verify_token(Headers(scope=scope))
            return self.app(scope, receive, send)
        return super().__call__(scope, receive, send)
