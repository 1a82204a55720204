# SPDX-License-Identifier: Apache-2.0
"""Startup calibration: fit one softmax temperature for the server and keep it only if it clearly helps."""
