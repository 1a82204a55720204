# SPDX-License-Identifier: Apache-2.0
"""The decide wing: what a decision is and how it is read (requests, question types and their
registry, backends, prompts, the engine host, reading and calibration maths, answers and reports,
settings, errors and metrics). Imports nothing of the other wings."""
