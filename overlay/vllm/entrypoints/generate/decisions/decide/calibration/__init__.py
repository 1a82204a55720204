# SPDX-License-Identifier: Apache-2.0
"""Startup calibration: fit softmax temperatures (server-wide and per question type) and keep each only if it clearly helps."""
