# SPDX-License-Identifier: Apache-2.0
"""The temperature an answer gets, with where it came from and whom it was fitted for, so the audit
can name exactly which T applied; and the precedence rule, in one place."""

from __future__ import annotations

from dataclasses import dataclass, field

SERVER = "server"
REQUEST = "request"

# What a calibration in force was fitted on.
FIRST_PASS = "first pass"
FULL = "full"
STAGES = (FIRST_PASS, FULL)


@dataclass(frozen=True)
class Temperature:
    value: float
    source: str  # "request", "configured", "calibrated" or "default"
    scope: str  # a question type's name, "server" or "request"


DEFAULT = Temperature(1.0, "default", SERVER)


@dataclass(frozen=True)
class Temperatures:
    """The server-wide T plus the question types calibrated on their own; any other gets the server's."""

    server: Temperature = DEFAULT
    by_type: dict[str, Temperature] = field(default_factory=dict)

    def for_type(self, name: str) -> Temperature:
        return self.by_type.get(name, self.server)

    def applied(self, qtype: str, requested: float | None = None) -> Temperature:
        """Request > configured > calibrated (this type's, else server-wide) > default; a configured
        or default server T comes with no per-type fits."""
        if requested:
            return Temperature(requested, "request", REQUEST)
        return self.for_type(qtype)

    def describe(self) -> str:
        text = f"T={self.server.value:.2f} ({self.server.source}, {self.server.scope})"
        if self.by_type:
            own = ", ".join(
                f"{name} T={t.value:.2f} ({t.source})"
                for name, t in sorted(self.by_type.items())
            )
            text += f"; {own}; other types the server-wide T"
        return text
