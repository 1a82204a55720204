# SPDX-License-Identifier: Apache-2.0
"""``--api-key`` on the decision paths: vLLM's own check, answered in each wire's error shape.

vLLM's authentication middleware answers a bad key on ``/v1/...`` paths itself, as
``{"error": "Unauthorized"}``, which is neither OpenAI's error shape nor Jev's, and leaves
``/api/alpha/decisions`` open. With typed decisions enabled, vLLM installs this subclass instead
(patches/api-router-wire): on the three decision paths it only records its verdict in the request
scope, and the decision route (routing.py) refuses in the wire's shape; everywhere else it is vLLM's.
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

from .paths import DECISION_PATHS

# The request scope key holding the verdict: True or False when a key is required, absent otherwise.
AUTHORIZED = "vllm.decisions.authorized"


class DecisionAuthentication(AuthenticationMiddleware):
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        if scope["type"] == "http" and path in DECISION_PATHS:
            scope[AUTHORIZED] = scope.get("method") == "OPTIONS" or self.verify_token(Headers(scope=scope))
            return self.app(scope, receive, send)
        return super().__call__(scope, receive, send)
