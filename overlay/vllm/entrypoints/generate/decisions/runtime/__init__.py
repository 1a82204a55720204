# SPDX-License-Identifier: Apache-2.0
"""The runtime wing: builds the decision service over vLLM's engine and starts it (plugins, the
backend's startup checks, the calibration run, a service per LoRA adapter). Imports ``calibration``
and ``decide``; only the HTTP wing and bulk import it."""
