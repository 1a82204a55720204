# SPDX-License-Identifier: Apache-2.0
"""Whether the model's chat template takes the decision instructions as a system message: Gemma 2's
(and other older families') raise on one, some drop it without a word."""

from __future__ import annotations

from vllm.entrypoints.generate.decisions.decide.errors import BackendUnavailable
from vllm.entrypoints.generate.decisions.decide.host import BackendHost
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import (
    SYSTEM_PROMPT,
    chat,
)

NO_TEMPLATE_HINT = (
    "the decision prompt is a chat; a model without a chat template (a base model) needs one: pass "
    "--chat-template FILE to vllm serve (a Jinja template in the model family's turn format)"
)


class UnusableTemplate(BackendUnavailable):
    """The chat template can't render the decision prompt at all."""


async def takes_system_role(host: BackendHost) -> bool:
    """Whether a probe's system message is rendered; :class:`UnusableTemplate` if neither layout is."""
    probe = "Paris is the capital of France."
    try:
        rendered = await host.render_chat(chat(probe, "Question: ?"))
    except Exception:
        # a template's own raise_exception, or a renderer error: try the other layout
        pass
    else:
        if SYSTEM_PROMPT in host.decode(rendered):
            return True
    try:
        rendered = await host.render_chat(chat(probe, "Question: ?", system_role=False))
    except Exception as exc:
        # The renderer's own text stays in the server's log (chained); the refusal says what to do.
        raise UnusableTemplate(
            f"the chat template can't render a user turn; {NO_TEMPLATE_HINT}"
        ) from exc
    if SYSTEM_PROMPT not in host.decode(rendered):
        raise UnusableTemplate("the chat template drops the text of the user turn")
    return False
