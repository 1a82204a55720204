"""Request tables shared by the unit tests (wire functions) and the server tests (HTTP)."""

from __future__ import annotations

from typing import Any

OPENAI_BASE: dict[str, Any] = {
    "model": "m",
    "input": "Ticket: payouts failing.",
    "questions": [{"type": "predicate", "name": "urgent", "instructions": "Urgent?"}],
}


def openai(**change: Any) -> dict[str, Any]:
    return {**OPENAI_BASE, **change}


def q(**fields: Any) -> list[dict[str, Any]]:
    return [fields]


CHOICES = [{"value": "a"}, {"value": "b"}]

# (case id, request body, text the error message must contain); each must get a 400.
OPENAI_INVALID: list[tuple[str, Any, str]] = [
    ("not an object", [1, 2], "body"),
    ("no model", {k: v for k, v in OPENAI_BASE.items() if k != "model"}, "model"),
    ("no input", {k: v for k, v in OPENAI_BASE.items() if k != "input"}, "input"),
    (
        "no questions",
        {k: v for k, v in OPENAI_BASE.items() if k != "questions"},
        "questions",
    ),
    ("empty questions", openai(questions=[]), "questions"),
    ("unknown top-level field", openai(temperature=0.5), "temperature"),
    (
        "unknown question type",
        openai(questions=q(type="ranking", instructions="x")),
        "questions[0].type",
    ),
    (
        "jev type on openai",
        openai(questions=q(type="noul", instructions="x")),
        "questions[0].type",
    ),
    ("question not an object", openai(questions=["predicate"]), "questions[0]"),
    (
        "explicit null name",
        openai(questions=q(type="predicate", instructions="x", name=None)),
        "questions[0].name",
    ),
    (
        "name not a string",
        openai(questions=q(type="predicate", instructions="x", name=3)),
        "questions[0].name",
    ),
    (
        "unknown question field",
        openai(questions=q(type="predicate", instructions="x", criteria={})),
        "criteria",
    ),
    (
        "no instructions",
        openai(questions=q(type="predicate")),
        "questions[0].instructions",
    ),
    (
        "image instructions",
        openai(
            questions=q(
                type="predicate",
                instructions=[
                    {"type": "input_image", "image_url": "data:image/png;base64,AA=="}
                ],
            )
        ),
        "text input only",
    ),
    (
        "one choice",
        openai(questions=q(type="choice", instructions="x", choices=[{"value": "a"}])),
        "choices",
    ),
    (
        "duplicate choices",
        openai(
            questions=q(type="choice", instructions="x", choices=[{"value": "a"}] * 2)
        ),
        "distinct",
    ),
    (
        "choice value a number",
        openai(
            questions=q(
                type="choice", instructions="x", choices=[{"value": 1}, {"value": "b"}]
            )
        ),
        "value",
    ),
    (
        "unknown choice field",
        openai(
            questions=q(
                type="choice",
                instructions="x",
                choices=[{"value": "a", "weight": 1}, {"value": "b"}],
            )
        ),
        "weight",
    ),
    (
        "one level",
        openai(questions=q(type="score", instructions="x", levels=[{"label": "a"}])),
        "levels",
    ),
    (
        "level without label",
        openai(
            questions=q(
                type="score", instructions="x", levels=[{"description": "a"}] * 2
            )
        ),
        "label",
    ),
    (
        "too many levels",
        openai(
            questions=q(
                type="score",
                instructions="x",
                levels=[{"label": str(i)} for i in range(11)],
            )
        ),
        "VLLM_TYPED_DECISIONS_MAX_LEVELS",
    ),
    (
        "too many choices",
        openai(
            questions=q(
                type="choice",
                instructions="x",
                choices=[{"value": str(i)} for i in range(256)],
            )
        ),
        "VLLM_TYPED_DECISIONS_MAX_CHOICES",
    ),
    (
        "image input",
        openai(
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": "https://x/y.png"}
                    ],
                }
            ]
        ),
        "text input only",
    ),
    (
        "unknown input item",
        openai(input=[{"type": "reasoning", "summary": []}]),
        "input[0]",
    ),
    ("unknown role", openai(input=[{"role": "tool", "content": "x"}]), "input[0]"),
    (
        "content not text",
        openai(input=[{"role": "user", "content": 5}]),
        "input[0].content",
    ),
    (
        "unknown part",
        openai(
            input=[{"role": "user", "content": [{"type": "input_audio", "data": "x"}]}]
        ),
        "input[0].content",
    ),
    (
        "output without call",
        openai(
            input=[{"type": "function_call_output", "call_id": "c1", "output": "ok"}]
        ),
        "input[0].call_id",
    ),
    (
        "bad cache options",
        openai(prompt_cache_options={"ttl": "1h"}),
        "prompt_cache_options.ttl",
    ),
    ("unknown extra field", openai(extra={"temperature": 2}), "extra.temperature"),
    ("bad detail", openai(extra={"detail": "everything"}), "extra.detail"),
    (
        "zero temperature",
        openai(extra={"calibration_temperature": 0}),
        "extra.calibration_temperature",
    ),
    ("unknown backend", openai(extra={"backend": "diffusion"}), "extra.backend"),
    (
        "bad backend option",
        openai(extra={"backend_options": {"readout": "sideways"}}),
        "extra.backend_options",
    ),
    (
        "unknown backend option",
        openai(extra={"backend_options": {"speed": 2}}),
        "extra.backend_options",
    ),
    ("empty cache salt", openai(extra={"cache_salt": ""}), "extra.cache_salt"),
    (
        "cache salt with a slash",
        openai(extra={"cache_salt": "tenant/7"}),
        "extra.cache_salt",
    ),
    (
        "cache salt too long",
        openai(extra={"cache_salt": "s" * 129}),
        "extra.cache_salt",
    ),
    ("cache salt at the top level", openai(cache_salt="tenant-7"), "cache_salt"),
    # extra.debias: the variable's forms, spelled exactly; extra.prior: a correction or auto.
    ("debias in capitals", openai(extra={"debias": "ROTATE"}), "extra.debias"),
    (
        "debias with no rotations",
        openai(extra={"debias": "rotate:0"}),
        "extra.debias: expected off, rotate or rotate:N with N >= 1",
    ),
    ("unknown prior", openai(extra={"prior": "learned"}), "extra.prior"),
    ("prior not a word", openai(extra={"prior": 1}), "'content-free+fitted'"),
    ("priority not an integer", openai(extra={"priority": "high"}), "extra.priority"),
    ("priority past int64", openai(extra={"priority": 2**63}), "extra.priority"),
    # The test servers and the unit tests' service schedule first come, first served.
    (
        "priority without the priority scheduler",
        openai(extra={"priority": 1}),
        "--scheduling-policy priority",
    ),
]

JEV_BASE: dict[str, Any] = {
    "model": "jev-latest",
    "state": "Ticket: payouts failing.",
    "questions": {"urgent": {"type": "noul", "instructions": "Urgent?"}},
}


def jev(**change: Any) -> dict[str, Any]:
    return {**JEV_BASE, **change}


def one(**question: Any) -> dict[str, Any]:
    return {"q": question}


# (case id, request body, text that must appear in the 422 detail); each must get a 422.
JEV_INVALID: list[tuple[str, Any, str]] = [
    ("not an object", "state", "body"),
    ("no state", {k: v for k, v in JEV_BASE.items() if k != "state"}, "state"),
    ("state a number", jev(state=3), "state"),
    (
        "no questions",
        {k: v for k, v in JEV_BASE.items() if k != "questions"},
        "questions",
    ),
    ("empty questions", jev(questions={}), "questions"),
    ("questions a list", jev(questions=[{"type": "noul"}]), "questions"),
    ("question not an object", jev(questions={"q": "noul"}), "q"),
    ("unknown type", jev(questions=one(type="ranking")), "ranking"),
    ("box", jev(questions=one(type="box", instructions="Find the cat")), "image"),
    (
        "predicate on jev",
        jev(questions=one(type="predicate", instructions="x")),
        "predicate",
    ),
    (
        "misspelled field",
        jev(questions=one(type="noul", instrucions="x")),
        "instrucions",
    ),
    (
        "unknown noul criterion",
        jev(questions=one(type="noul", criteria={"maybe": "x"})),
        "maybe",
    ),
    ("one choice", jev(questions=one(type="choice", criteria={"a": None})), "criteria"),
    (
        "choice criteria a list",
        jev(questions=one(type="choice", criteria=["a", "b"])),
        "criteria",
    ),
    (
        "score map form",
        jev(questions=one(type="score", criteria={"0": "low", "1": "high"})),
        "criteria",
    ),
    ("one level", jev(questions=one(type="score", criteria=["only"])), "criteria"),
    (
        "too many levels",
        jev(questions=one(type="score", criteria=[str(i) for i in range(11)])),
        "VLLM_TYPED_DECISIONS_MAX_LEVELS",
    ),
    (
        "too many choices",
        jev(questions=one(type="choice", criteria={str(i): None for i in range(256)})),
        "VLLM_TYPED_DECISIONS_MAX_CHOICES",
    ),
    ("backend twice", jev(backend="logit", extra={"backend": "logit"}), "backend"),
    ("unknown backend", jev(backend="diffusion"), "backend"),
    ("unknown extra field", jev(extra={"temperature": 2}), "temperature"),
    ("bad detail", jev(extra={"detail": "all"}), "detail"),
    ("bad debias", jev(extra={"debias": "rotate:01"}), "rotate:N with N >= 1"),
    ("bad prior", jev(extra={"prior": "Auto"}), "'auto', 'off'"),
    ("cache salt with a NUL", jev(cache_salt="a\x00b"), "cache_salt"),
    ("bad cache salt under extra", jev(extra={"cache_salt": ""}), "cache_salt"),
    ("cache salt twice", jev(cache_salt="a", extra={"cache_salt": "a"}), "not both"),
    ("priority a float", jev(priority=1.5), "priority"),
    ("priority twice", jev(priority=0, extra={"priority": 0}), "not both"),
    (
        "priority without the priority scheduler",
        jev(priority=-5),
        "--scheduling-policy priority",
    ),
    ("top-level instructions", jev(instructions="Be strict."), "instructions"),
    ("images", jev(images=["https://example.com/cat.png"]), "image inputs"),
    ("audio", jev(audio=["data:audio/wav;base64,AA=="]), "audio inputs"),
    ("videos", jev(videos=["https://example.com/cat.mp4"]), "video inputs"),
]
