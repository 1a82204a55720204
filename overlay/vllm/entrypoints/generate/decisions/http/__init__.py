# SPDX-License-Identifier: Apache-2.0
"""The HTTP wing: the decision endpoints on vLLM's app (endpoint plugin, routes, API key, bodies,
paths) and the two wire formats. Imports ``runtime`` and ``decide``; neither imports it."""
