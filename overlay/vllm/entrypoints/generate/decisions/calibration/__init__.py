# SPDX-License-Identifier: Apache-2.0
"""Calibration: fits and saves at startup (calibrate.startup_calibration), refits from the operator's
labels while serving (live_labels.watch); in_force.Calibrated is the record answers apply.
"""
