# SPDX-License-Identifier: Apache-2.0
"""The decision service: a request as the wires compile it, the service that answers it, and whether
the service is ready to."""
