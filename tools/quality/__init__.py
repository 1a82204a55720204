"""Measuring answers: accuracy, calibration, option mass, the held-out set."""
