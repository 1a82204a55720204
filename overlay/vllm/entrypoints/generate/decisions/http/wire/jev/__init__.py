# SPDX-License-Identifier: Apache-2.0
"""Jev's System One API: protocol models, serving, routes."""
