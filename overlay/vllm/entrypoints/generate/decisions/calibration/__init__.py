# SPDX-License-Identifier: Apache-2.0
"""Calibration: fits and saves at startup (calibrate.startup_calibration), refits from the operator's
labels while serving (live_labels.watch); what answers apply is typed in decide/reading/calibrated.py.
"""
