"""Fuzzing helpers: requests generated from the server's own OpenAPI schema, the same requests with
one mistake, hostile raw bodies, the corpus of cases that once failed, and the judge of a response.

``SchemaCases(schema, seed)`` walks a JSON schema (the subset pydantic emits: type, properties,
required, additionalProperties, items, anyOf/oneOf, const, enum, min/max lengths) and produces
values that fit it, with strings and numbers drawn from hostile palettes (empty, control characters,
other scripts, combining marks, emoji sequences, huge numbers). ``mutated`` then breaks one thing:
a value of the wrong type, a required key dropped, an unknown key, a NaN, a list where an object goes.
``HOSTILE`` holds raw bodies no generator would write; ``AMPLIFYING`` the bodies, one per class, that
are small on the wire but ask for far more work (rendering, tokenizing) than their size. Sizes stay small so that the valid-shaped
requests that reach a real model stay cheap.
"""

from __future__ import annotations

import base64
import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tools.bench.soak import well_formed

CORPUS = Path(__file__).parent / "fuzz_corpus"

STRINGS = [
    "",
    " ",
    "x",
    "Is it urgent?",
    "billing",
    "0",
    "true",
    "null",
    "\u0000",
    "\t\n\r",
    "é",
    "ü\u0308",
    "東京",
    "🚀",
    "👩‍💻",
    "مرحبا",
    "\u202e\u202d",
    "<|im_end|>",
    "{{ raise }}",
    "' OR 1=1",
    "a" * 300,
    "\ufeff",
    "\U0010ffff",
    "Option A",
    "A",
]
NUMBERS = [0, 1, -1, 2, 7, 10**30, -(10**30), 0.5, 1e-300, 5e-324, 1e308, 3.14159]
WRONG = [None, True, 0, -5, 1.5, "text", [], [1, "a"], {}, {"unknown": 1}]


class SchemaCases:
    def __init__(self, schema: dict[str, Any], seed: int) -> None:
        self.schema = schema
        self.rng = random.Random(seed)

    def valid(self, schema: dict[str, Any] | None = None, depth: int = 0) -> Any:
        """A value that fits ``schema`` (the whole request schema by default)."""
        schema = self.schema if schema is None else schema
        rng = self.rng
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.valid(rng.choice(schema[key]), depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = rng.choice(kind)
        if kind is None:  # any JSON value
            kind = rng.choice(
                ["string", "integer", "boolean", "null"]
                + (["array", "object"] if depth < 3 else [])
            )
        if kind == "string":
            text = rng.choice(STRINGS)
            return (
                text
                if len(text) >= schema.get("minLength", 0)
                else text + "x" * schema["minLength"]
            )
        if kind == "integer":
            return rng.choice([n for n in NUMBERS if isinstance(n, int)])
        if kind == "number":
            return rng.choice(NUMBERS)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "null":
            return None
        if kind == "array":
            low = schema.get("minItems", 0)
            high = min(schema.get("maxItems", low + 3), low + 3)
            return [
                self.valid(schema.get("items", {}), depth + 1)
                for _ in range(rng.randint(low, high))
            ]
        return self.object(schema, depth)

    def object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        rng = self.rng
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        value = {
            name: self.valid(sub, depth + 1)
            for name, sub in properties.items()
            if name in required or rng.random() < 0.4
        }
        extra = schema.get("additionalProperties", not properties)
        wanted = max(schema.get("minProperties", 0), rng.randint(0, 3) if extra else 0)
        while extra and len(value) < wanted + len(properties) and depth < 4:
            name = rng.choice(STRINGS[1:12]) + str(rng.randint(0, 99))
            value[name] = self.valid(
                extra if isinstance(extra, dict) else {}, depth + 1
            )
            if len(value) >= wanted:
                break
        return value

    def mutated(self, value: Any) -> Any:
        """``value`` with one thing broken somewhere in it."""
        broken = copy.deepcopy(value)
        holders = list(containers(broken))
        holder = self.rng.choice(holders)
        rng = self.rng
        if isinstance(holder, dict) and holder:
            key = rng.choice(list(holder))
            action = rng.choice(("wrong", "drop", "unknown", "nan"))
            if action == "wrong":
                holder[key] = rng.choice(WRONG)
            elif action == "drop":
                del holder[key]
            elif action == "unknown":
                holder[f"unexpected_{rng.randint(0, 9)}"] = rng.choice(WRONG)
            else:
                holder[key] = float("nan")
        elif isinstance(holder, list) and holder:
            index = rng.randrange(len(holder))
            holder[index] = rng.choice(WRONG)
        else:
            return rng.choice(WRONG)
        return broken


def containers(value: Any) -> list[Any]:
    """Every dict and list inside ``value``, itself included."""
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (dict, list)):
            found.append(item)
            stack.extend(item.values() if isinstance(item, dict) else item)
    return found


def encode(value: Any) -> bytes:
    """JSON as a careless client would send it: NaN stays NaN."""
    return json.dumps(value, allow_nan=True).encode("utf-8", errors="surrogatepass")


# Raw bodies for both endpoints: (body, what it is).
HOSTILE = [
    (b"", "empty body"),
    (b"null", "null"),
    (b"[]", "an array"),
    (b'"questions"', "a string"),
    (b"{", "truncated"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b'{"questions": [], "questions": []}', "duplicate keys"),
    (b'{"state": "\\ud800", "input": "\\udfff"}', "lone surrogates"),
    (b'{"input": NaN, "state": Infinity}', "NaN and Infinity"),
    (b"[" * 5000 + b"]" * 5000, "deeply nested"),
    (b'{"state": ' + b'{"a": ' * 400 + b"1" + b"}" * 400 + b"}", "deeply nested state"),
    (
        b'{"state": ['
        + b",".join([b'{"a": ' * 300 + b"1" + b"}" * 300] * 40)
        + b'], "input": "x"}',
        "70 KB of nesting that renders to megabytes of indented text",
    ),
    (
        b'{"model": "m", "input": "' + b"x" * (10 * 2**20) + b'", "state": "x"}',
        "a 10 MiB input",
    ),
    (
        b'{"model": "m", "input": "x", "state": "x", "questions": ['
        + b'{"type": "predicate", "instructions": "?"},' * 5000
        + b"{}]}",
        "5,000 questions",
    ),
    (
        b'{"model": "m", "input": "x", "questions": [{"type": "choice", "instructions": "?", "choices": ['
        + b",".join(b'{"value": "c%d"}' % i for i in range(5000))
        + b"]}]}",
        "5,000 choices",
    ),
    (
        b'{"state": "x", "questions": {"q": {"type": "choice", "criteria": {'
        + b",".join(b'"c%d": null' % i for i in range(5000))
        + b"}}}}",
        "5,000 criteria",
    ),
    # Numbers no field takes: a denormal temperature once answered null probabilities with a 200, and
    # a number of more digits than Python converts was a server error in the wrong wire's shape.
    (
        (
            b'{"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "?"}],'
            b' "extra": {"calibration_temperature": 5e-324}}'
        ),
        "OpenAI: a denormal temperature",
    ),
    (
        (
            b'{"state": "x", "questions": {"q": {"type": "noul"}},'
            b' "extra": {"calibration_temperature": 1e-310}}'
        ),
        "Jev: a denormal temperature",
    ),
    (b'{"state": "x", "input": ' + b"9" * 5000 + b"}", "a 5,000-digit number"),
]


def nested(depth: int) -> Any:
    """A chain of one-key objects ``depth`` deep: ~6 bytes a level, rendering to ~depth**2 characters."""
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


# Amplifying bodies: small on the wire, huge once rendered or tokenized, each value within the per-value
# limits; issue 38 measured each stalling a server for seconds before its refusal. (path, body, what it is).
SENTENCE = "the quick brown fox jumps over the lazy dog "
AMPLIFYING = [
    (
        "/v1/systemone",
        json_bytes(
            {
                "state": "x",
                "questions": {
                    **{
                        f"q{i}": {
                            "type": "noul",
                            "instructions": nested(500),
                            "criteria": {"true": nested(500)},
                        }
                        for i in range(16)
                    },
                    "last": {"type": "no-such-type"},
                },
            }
        ),
        "Jev: 16 questions of nested instructions and criteria (~100 KB) that render to ~16 M characters",
    ),
    (
        "/v1/systemone",
        json_bytes({"state": nested(900), "questions": {"q": {"type": "noul"}}}),
        "Jev: a state nested 900 deep (~5 KB), past MAX_JSON_DEPTH",
    ),
    (
        "/v1/decisions",
        json_bytes(
            {
                "model": "m",
                "questions": [{"type": "predicate", "instructions": "?"}],
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_json", "data": nested(240)}
                            for _ in range(60)
                        ],
                    }
                ],
            }
        ),
        "OpenAI: 60 input_json parts (~90 KB) that render to ~7 M characters",
    ),
    (
        "/v1/decisions",
        json_bytes(
            {
                "model": "m",
                "input": "x",
                "questions": [
                    {"type": "predicate", "instructions": SENTENCE * 3500}
                    for _ in range(24)
                ],
            }
        ),
        "OpenAI: 24 questions of 150 K characters each",
    ),
    (
        "/v1/systemone",
        json_bytes(
            {
                "state": "x",
                "questions": {
                    f"q{i}": {"type": "noul", "instructions": SENTENCE * 3500}
                    for i in range(24)
                },
            }
        ),
        "Jev: 24 questions of 150 K characters each",
    ),
]

FIELDS = {
    "model",
    "input",
    "questions",
    "state",
    "extra",
    "type",
    "instructions",
    "choices",
    "levels",
    "criteria",
    "name",
    "value",
    "label",
    "description",
    "backend",
    "backend_options",
    "content",
    "role",
    "body",
}
PARSE_WORDS = ("JSON", "UTF-8", "Unicode", "body")


def path_variants(path: str) -> list[str]:
    """Spellings of a decision path that no request may be answered on without the API key: a trailing
    newline or CR (a route pattern ending in ``$`` matches before a newline), slashes, case, queries."""
    head, tail = path.rsplit("/", 1)
    return [
        path,
        path + "%0A",
        path + "%0a?x=1",
        path + "%0D",
        path + "%0D%0A",
        path + "/",
        path + "%2F",
        "/" + path,
        f"{head}//{tail}",
        path.upper(),
        path + "?x=1",
        path + "%20",
        path + "%09",
        path + "/.",
        path + "#frag",
    ]


def generated_cases(
    schema: dict[str, Any], path: str, count: int, seed: int
) -> Iterator[tuple[str, bytes]]:
    """``count`` bodies from ``schema``, every other one with a mistake, then the hostile ones."""
    cases = SchemaCases(schema, seed)
    for i in range(count):
        value = cases.valid()
        yield path, encode(cases.mutated(value) if i % 2 else value)
    for body, _ in HOSTILE:
        yield path, body
    for amplified_path, body, _ in AMPLIFYING:
        if amplified_path == path or {path, amplified_path} == {
            "/v1/systemone",
            "/api/alpha/decisions",
        }:
            yield path, body


def corpus_entry(path: str, body: bytes) -> str:
    """A failing case in the corpus's file format."""
    try:
        return json.dumps({"path": path, "body": body.decode("utf-8")})
    except UnicodeDecodeError:
        return json.dumps(
            {"path": path, "body_base64": base64.b64encode(body).decode()}
        )


def corpus_cases() -> Iterator[tuple[str, bytes]]:
    for file in sorted(CORPUS.glob("*.json")):
        entry = json.loads(file.read_text())
        body = (
            entry["body"].encode()
            if "body" in entry
            else base64.b64decode(entry["body_base64"])
        )
        yield entry["path"], body


def request_schema(document: dict[str, Any], path: str) -> dict[str, Any]:
    """The request body schema of ``path`` in an OpenAPI ``document``, its ``$ref``s resolved."""
    components = document.get("components", {}).get("schemas", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            reference = node.get("$ref", "")
            if reference.startswith("#/components/schemas/"):
                target = components[reference.removeprefix("#/components/schemas/")]
                return resolve(
                    {**target, **{k: v for k, v in node.items() if k != "$ref"}}
                )
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return resolve(
        document["paths"][path]["post"]["requestBody"]["content"]["application/json"][
            "schema"
        ]
    )


def keys_in(value: Any) -> set[str]:
    return {
        key
        for holder in containers(value)
        if isinstance(holder, dict)
        for key in holder
    }


def judge(path: str, body: bytes, response: httpx.Response) -> str | None:
    """None if ``response`` is a proper answer to ``body``; else what is wrong, with the case."""
    status = response.status_code
    problem = None
    if status >= 500:
        problem = f"{status}: {response.text[:300]}"
    elif status >= 400:
        problem = unhelpful(path, body, response)
    elif status == 200:
        try:
            well_formed(path, json.loads(body), response.json())
        except (AssertionError, KeyError, ValueError, TypeError) as exc:
            problem = f"malformed 200 ({exc!r}): {response.text[:300]}"
    else:
        problem = f"unexpected status {status}"
    return (
        None
        if problem is None
        else f"{problem}\n  case: {corpus_entry(path, body)[:600]}"
    )


def unhelpful(path: str, body: bytes, response: httpx.Response) -> str | None:
    """Why a 4xx doesn't say what is wrong, or None when it names a field, a setting or the parse error."""
    try:
        payload = response.json()
    except ValueError:
        return (
            f"{response.status_code} without a JSON error body: {response.text[:200]}"
        )
    if path == "/v1/decisions":
        message = str(payload.get("error", {}).get("message", ""))
    else:
        detail = payload.get("detail")
        if isinstance(detail, list):
            if all(entry.get("loc") and entry.get("msg") for entry in detail):
                return None  # Jev's validation errors locate every problem
            message = json.dumps(detail)
        elif isinstance(detail, dict):
            if not detail.get("error_type"):
                return f"{response.status_code} without detail.error_type: {response.text[:200]}"
            message = str(detail.get("message") or "")
        else:
            return f"{response.status_code} not in Jev's error shape: {response.text[:200]}"
    if not message:
        return f"{response.status_code} with no message"
    try:
        named = FIELDS | keys_in(json.loads(body))
    except (ValueError, RecursionError):
        named = FIELDS
    if (
        "VLLM_TYPED_DECISIONS_" in message
        or "--max" in message
        or any(word in message for word in PARSE_WORDS)
    ):
        return None
    if any(name and name in message for name in named):
        return None
    return f"{response.status_code} names no field or setting: {message[:300]}"
