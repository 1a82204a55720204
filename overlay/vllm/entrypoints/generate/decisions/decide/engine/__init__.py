# SPDX-License-Identifier: Apache-2.0
"""The engine behind the ``BackendHost`` seam (decide/host.py): ``VllmHost`` over vLLM's engine
client, what one read asks of the engine, and the bound on a prompt's characters per token."""
