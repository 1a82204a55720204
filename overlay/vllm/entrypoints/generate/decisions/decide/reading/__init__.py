# SPDX-License-Identifier: Apache-2.0
"""A question's read after the backend's: option rotation (debias), the prior correction, the
calibrated temperature and the confidence arithmetic."""
