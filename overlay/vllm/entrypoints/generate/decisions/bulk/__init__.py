# SPDX-License-Identifier: Apache-2.0
"""Decisions without a web server: ``vllm run-batch`` over files of decision requests (run_batch.py)
and a Python API over an engine you already hold (:class:`Decisions`)."""

from vllm.entrypoints.generate.decisions.bulk.in_process import Decisions, Result

__all__ = ["Decisions", "Result"]
