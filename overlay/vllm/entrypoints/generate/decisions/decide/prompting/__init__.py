# SPDX-License-Identifier: Apache-2.0
"""The standard decision prompt, shared by the backends that read option labels from a chat model
(logit, canvas) and by plugins."""
