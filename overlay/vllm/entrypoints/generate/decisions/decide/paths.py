# SPDX-License-Identifier: Apache-2.0
"""The decision endpoints' paths, written once: the routes, the API-key check, the metrics' endpoint
label and bulk's URLs all name them from here, so a path can't be added in one place and missed in
another. Imports nothing, so any module may use it."""

DECISIONS = "/v1/decisions"  # OpenAI's Decisions API
SYSTEMONE = "/v1/systemone"  # Jev's System One API
ALPHA_PREFIX = "/api/alpha"  # outside vLLM's guarded prefixes: auth.py guards it
# the System One API under its earlier path
SYSTEMONE_ALPHA = ALPHA_PREFIX + "/decisions"

DECISION_PATHS = (DECISIONS, SYSTEMONE, SYSTEMONE_ALPHA)
