# SPDX-License-Identifier: Apache-2.0
"""Backends: what one is (base.py) and the built-in ones; registry.py registers and chooses them."""

from .base import DecisionBackend, Reading
from .canvas import CanvasBackend
from .encoder import EncoderBackend
from .logit import LogitBackend

__all__ = ["CanvasBackend", "DecisionBackend", "EncoderBackend", "LogitBackend", "Reading"]
