# SPDX-License-Identifier: Apache-2.0
"""``--api-key`` on the decision routes, failing closed: vLLM's middleware refuses under ``/v1`` as
``{"error": "Unauthorized"}`` (neither wire's shape) and leaves ``/api/alpha`` open. This subclass
records its verdict in the request scope and lets a decision route refuse in its wire's shape; which
route that is, the router's match decides, never a comparison of path strings."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Awaitable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from vllm.entrypoints.generate.decisions.decide.paths import ALPHA_PREFIX
from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

# The request scope key of the middleware's verdict on the request's key.
AUTHORIZED = "vllm.decisions.authorized"


def key_required(args: Namespace | None) -> bool:
    """Whether the server has an API key, by vLLM's rule (``--api-key``, else ``VLLM_API_KEY``)."""
    import vllm.envs as envs

    return any(getattr(args, "api_key", None) or [envs.VLLM_API_KEY])


def answered_by_decision_route(scope: Scope) -> bool:
    """Whether the route Starlette will pick (the first full match) is a decision route."""
    app = scope.get("app")
    for route in getattr(getattr(app, "router", None), "routes", ()):
        if route.matches(scope)[0] is Match.FULL:
            return bool(getattr(route, "checks_decision_authorization", False))
    return False


def guarded_by_us(scope: Scope) -> bool:
    """A path under the Jev alias's prefix, which vLLM leaves open, however spelt (slashes, case)."""
    path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
    return ("/" + path.lstrip("/")).lower().startswith(ALPHA_PREFIX)


class DecisionAuthentication(AuthenticationMiddleware):
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] != "http":
            return super().__call__(scope, receive, send)
        scope[AUTHORIZED] = self.verify_token(Headers(scope=scope))
        if answered_by_decision_route(scope):
            return self.app(scope, receive, send)
        if (
            guarded_by_us(scope)
            and not scope[AUTHORIZED]
            and scope.get("method") != "OPTIONS"
        ):
            refusal = JSONResponse({"error": "Unauthorized"}, status_code=401)
            return refusal(scope, receive, send)
        return super().__call__(scope, receive, send)
