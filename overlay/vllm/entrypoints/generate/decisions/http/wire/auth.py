# SPDX-License-Identifier: Apache-2.0
"""``--api-key`` on the decision routes, failing closed, answered in each wire's error shape.

vLLM's authentication middleware answers a bad key on paths under ``/v1`` (and a few other prefixes)
itself, as ``{"error": "Unauthorized"}``, which is neither OpenAI's error shape nor Jev's, and leaves
``/api/alpha/decisions`` open. With typed decisions enabled, vLLM installs this subclass instead
(patches/api-router-wire): it records its verdict on every HTTP request in the request scope; a request
that a decision route will answer goes on to that route, which refuses in its wire's shape
(decision_route.py); anything else meets vLLM's own check, with ``/api/alpha`` guarded too.

Whether a request needs the key is decided by the route that would answer it, never by comparing path
strings, and the route itself refuses unless the verdict is present and true whenever the server has a
key (:func:`key_required`): a request that reached it some other way is refused, not let through.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Awaitable

from starlette.datastructures import Headers
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from vllm.entrypoints.generate.decisions.decide.paths import ALPHA_PREFIX
from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

# The request scope key holding the middleware's verdict on the request's key: True or False.
AUTHORIZED = "vllm.decisions.authorized"


def key_required(args: Namespace | None) -> bool:
    """Whether the server was started with an API key: vLLM's own rule (``--api-key``, else
    ``VLLM_API_KEY``), read where the route can check it without the middleware's help."""
    import vllm.envs as envs

    keys = getattr(args, "api_key", None) or [envs.VLLM_API_KEY]
    return any(keys)


def answered_by_decision_route(scope: Scope) -> bool:
    """Whether the route that will answer this request is a decision route, which refuses a bad key
    itself: the first route matching it fully, as Starlette's router picks."""
    app = scope.get("app")
    for route in getattr(getattr(app, "router", None), "routes", ()):
        if route.matches(scope)[0] is Match.FULL:
            # decision_route.py
            return bool(getattr(route, "checks_decision_authorization", False))
    return False


def guarded_by_us(scope: Scope) -> bool:
    """A path under the Jev alias's prefix, however spelt, which vLLM's prefixes leave open: guarded here
    so that no variant of it (a trailing slash, doubled slashes, another case) reaches any handler."""
    path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
    return ("/" + path.lstrip("/")).lower().startswith(ALPHA_PREFIX)


class DecisionAuthentication(AuthenticationMiddleware):
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] != "http":
            return super().__call__(scope, receive, send)
        scope[AUTHORIZED] = self.verify_token(Headers(scope=scope))
        if answered_by_decision_route(scope):
            # the route refuses a bad key in its wire's shape
            return self.app(scope, receive, send)
        if (
            guarded_by_us(scope)
            and not scope[AUTHORIZED]
            and scope.get("method") != "OPTIONS"
        ):
            return self.refuse(scope, receive, send)
        return super().__call__(scope, receive, send)

    @staticmethod
    def refuse(scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        from starlette.responses import JSONResponse

        return JSONResponse({"error": "Unauthorized"}, status_code=401)(
            scope, receive, send
        )
