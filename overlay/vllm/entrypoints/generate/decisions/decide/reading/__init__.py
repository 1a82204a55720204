# SPDX-License-Identifier: Apache-2.0
"""A question's read after the backend's: its plan, option rotation (debias), the prior correction
and the calibrated temperature, resolved once and applied in one ``read(plan)``."""
