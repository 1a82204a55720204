# SPDX-License-Identifier: Apache-2.0
"""The standard decision prompt, shared by every backend that reads option labels from a chat model
(logit, canvas) and by plugins: the messages (prompt.py), the option labels (labels.py) and the place
in the rendered prompt where the answer's first token goes (answer_slot.py)."""
