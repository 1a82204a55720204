# SPDX-License-Identifier: Apache-2.0
"""The decide wing: what a decision is and how it is read, from request to report. Imports nothing
of the other wings."""
