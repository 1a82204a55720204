# SPDX-License-Identifier: Apache-2.0
"""The logit backend: next-token log-probabilities over option labels, for any generative model."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
)
from vllm.entrypoints.generate.decisions.decide.backends.logit.options import (
    LogitOptions,
)
from vllm.entrypoints.generate.decisions.decide.backends.logit.precision import (
    describe,
    fp32_check,
)
from vllm.entrypoints.generate.decisions.decide.backends.logit.readouts import (
    ReadoutRunner,
    plan,
)
from vllm.entrypoints.generate.decisions.decide.backends.logit.self_check import (
    PROBES,
    probe_mass,
    self_check,
)
from vllm.entrypoints.generate.decisions.decide.backends.logit.stencil import (
    StencilPool,
    stencil_check,
)
from vllm.entrypoints.generate.decisions.decide.errors import BackendUnavailable
from vllm.entrypoints.generate.decisions.decide.host import BackendHost
from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import (
    ANSWER_CUE,
    AnswerSlotPlacer,
)
from vllm.entrypoints.generate.decisions.decide.prompting.chat_template import (
    takes_system_role,
)
from vllm.entrypoints.generate.decisions.decide.prompting.labels import (
    LabelCatalog,
    pair_candidates,
)
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import (
    RENDER_VERSION,
    question_text,
)
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.settings import (
    PREFIX,
    Settings,
    SettingsError,
)
from vllm.logger import init_logger

logger = init_logger(__name__)


class StartupFacts(BaseModel):
    """What the startup checks found, adopted by every API-server process of the server."""

    # Whether the chat template takes the instructions as a system message.
    system_role: bool
    # What the answer slot appends to close an ending the template leaves open (a reasoning block,
    # harmony's channel), then the empty reasoning block the self-check chose, and its option mass.
    closing: str
    reasoning_block: str
    option_mass: float
    # The probes' option mass with labels=words (None: no probe's words are single tokens); below the
    # minimum, reads asking for words use letters.
    words_option_mass: float | None = None
    # Marker pairs that are single tokens on this tokenizer: the wide-direct labels.
    pairs: list[str]
    stencil: bool
    # Why fp32 reads are unavailable (None: they passed their check).
    fp32_missing: str | None


class LogitBackend(DecisionBackend[LogitOptions]):
    name = "logit"
    render_version = RENDER_VERSION
    options_model = LogitOptions
    facts_model = StartupFacts
    startup_only = ("markers",)
    layout_option = "labels"
    layouts = ("letters", "words")

    def __init__(
        self,
        host: BackendHost,
        options: LogitOptions | None = None,
        settings: Settings | None = None,
    ) -> None:
        super().__init__(host, options or LogitOptions(), settings)
        markers = self.options.markers
        # The default 26 letters may exceed the default window (20), and top-k floors the rest; markers
        # configured on purpose must fit.
        explicit = "markers" in self.options.model_fields_set
        if explicit and host.max_logprobs != -1 and len(markers) > host.max_logprobs:
            raise SettingsError(
                f"{PREFIX}BACKEND: {len(markers)} markers can't all fit a top-k read of "
                f"--max-logprobs {host.max_logprobs}; raise --max-logprobs or configure fewer markers"
            )
        self.placer = AnswerSlotPlacer(host)
        self.catalog = LabelCatalog(tuple(markers), ())
        self.prompts = StencilPool(host, enabled=False)
        self.runner = ReadoutRunner(host, self.placer, self.catalog, self.prompts)
        self.facts: StartupFacts | None = None

    async def start(self) -> StartupFacts:
        """The answer-slot self-check, the label pairs, the stencil and precision checks."""
        host = self.host
        if host.logprobs_mode != "raw_logprobs":
            raise BackendUnavailable(
                f"--logprobs-mode {host.logprobs_mode} does not return log-probabilities; "
                "the logit backend needs raw_logprobs (the default)"
            )
        system_role = self.prompts.system_role = await takes_system_role(host)
        minimum = self.settings.min_option_mass
        check = await self_check(host, self.prompts, self.placer, self.catalog, minimum)
        if not check.passed:
            raise BackendUnavailable(check.failure(minimum, f"{PREFIX}MIN_OPTION_MASS"))
        state, question = PROBES[0]
        rendered = await self.prompts.prompt_ids(
            state, question_text(question, ["A", "B"])
        )
        pairs = self.placer.single_token_labels(
            rendered, pair_candidates(self.options.markers)
        )
        slot = self.placer.place(rendered, ["A", "B"])
        words_mass = await probe_mass(
            host, self.prompts, self.placer, self.catalog, words=True
        )
        facts = StartupFacts(
            system_role=system_role,
            closing=self.placer.closing(rendered),
            reasoning_block=check.reasoning_block,
            option_mass=check.option_mass,
            words_option_mass=words_mass,
            pairs=pairs,
            stencil=await stencil_check(host, system_role),
            fp32_missing=await fp32_check(host, slot.prompt_ids, slot.label_ids),
        )
        self.adopt(facts)
        return facts

    def adopt(self, facts: StartupFacts) -> None:
        self.facts = facts
        self.placer.reasoning_block = facts.reasoning_block
        self.catalog = self.runner.catalog = LabelCatalog(
            self.catalog.markers, tuple(facts.pairs)
        )
        missing, minimum = facts.fp32_missing, self.settings.min_option_mass
        self.runner.fp32_reads = missing is None
        self.runner.word_reads = (
            facts.words_option_mass is not None and facts.words_option_mass >= minimum
        )
        self.prompts.enabled = facts.stencil
        self.prompts.system_role = facts.system_role
        logger.info(describe_prompt(facts, minimum))
        logger.info(self.describe_limits())
        logger.info(describe(self.host, missing))

    def read_key(self) -> dict[str, Any]:
        facts = self.facts
        if facts is None:
            return {}
        return {
            "fp32_reads": facts.fp32_missing is None,
            "word_reads": self.runner.word_reads,
            "system_role": facts.system_role,
            "closing": facts.closing,
            "reasoning_block": facts.reasoning_block,
            "pairs": list(facts.pairs),
        }

    def describe_limits(self) -> str:
        markers, wide = len(self.catalog.markers), self.catalog.wide_capacity
        cap, window = self.host.max_logprob_token_ids, self.host.max_logprobs
        return (
            f"decision readouts: direct up to {markers}, wide-direct up to {min(wide, cap)} (exact), "
            f"top-k wide-direct up to {wide}, two-stage beyond (read limits: max_logprobs={window}, "
            f"token-id cap={cap}); logit logprobs: {self.options.logprobs}"
            + (
                f" (window {window} = --max-logprobs)"
                if self.options.logprobs == "top-k"
                else ""
            )
        )

    async def read(
        self, question: CompiledQuestion, context: ReadContext[LogitOptions]
    ) -> Reading:
        options = context.options or self.options
        chosen = plan(
            len(question.options),
            options,
            self.catalog,
            self.host.max_logprob_token_ids,
        )
        return await self.runner.run(chosen, question, context.with_options(options))


def describe_prompt(facts: StartupFacts, minimum: float | None = None) -> str:
    where = (
        "a system message"
        if facts.system_role
        else "the head of the user turn (the chat template has no system role)"
    )
    shared = (
        "once per request"
        if facts.stencil
        else "with each question (this tokenizer or template can't share it)"
    )
    ending = (
        f"closes the template's open ending with {facts.closing!r}, then "
        if facts.closing
        else ""
    )
    block = (
        f"the empty reasoning block {facts.reasoning_block!r}, then "
        if facts.reasoning_block
        else ""
    )
    words = facts.words_option_mass
    if words is None:
        words_mass = "none of the probes' words are single tokens (reads asking for words use letters)"
    else:
        below = minimum is not None and words < minimum
        words_mass = f"{words:.3f}" + (
            f" (below {minimum}: reads asking for words use letters)" if below else ""
        )
    return (
        f"decision prompt: instructions in {where}; state rendered {shared}; answer slot: {ending}{block}"
        f"{ANSWER_CUE!r}; option mass {facts.option_mass:.3f} (letters), words option mass {words_mass}"
    )
