# SPDX-License-Identifier: Apache-2.0
"""The decision endpoints' paths, written once so that no module can miss one. Imports nothing."""

DECISIONS = "/v1/decisions"  # OpenAI's Decisions API
SYSTEMONE = "/v1/systemone"  # Jev's System One API
ALPHA_PREFIX = "/api/alpha"  # outside vLLM's guarded prefixes: auth.py guards it
SYSTEMONE_ALPHA = ALPHA_PREFIX + "/decisions"  # System One under its earlier path

DECISION_PATHS = (DECISIONS, SYSTEMONE, SYSTEMONE_ALPHA)
