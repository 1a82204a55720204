# SPDX-License-Identifier: Apache-2.0
"""OpenAI's Decisions API: protocol models, serving, route."""
