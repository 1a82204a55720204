# SPDX-License-Identifier: Apache-2.0
"""The decision routes' request bodies in the server's OpenAPI document (``/openapi.json``).

The routes parse their bodies themselves (strict JSON, each wire's own error shape), so FastAPI can't
see their shape. This fills it in from the pydantic models the wires validate with, and the question
types registered by the time the document is first asked for (plugins included). Each schema is
self-contained (references inlined), so a client generator or a fuzzer can use it as it is.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, TypeAdapter

from .registry import built_in_question_type, question_type, question_type_names
from .wire.jev import SystemOneRequest
from .wire.openai import BUILT_IN, DecisionsRequest
from .wire.openai_input import INPUT_ITEM


def inline(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``#/$defs/...`` reference replaced by its definition (no recursion in
    these models, so this terminates)."""
    definitions = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            reference = node.get("$ref", "")
            if reference.startswith("#/$defs/"):
                merged = {
                    **definitions[reference.removeprefix("#/$defs/")],
                    **{k: v for k, v in node.items() if k != "$ref"},
                }
                return resolve(merged)
            # A discriminator's mapping names definitions that are inlined now; the tags stay in the schemas.
            return {key: resolve(value) for key, value in node.items() if key not in ("$defs", "discriminator")}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return resolve(schema)


def schema_of(model: type[BaseModel] | TypeAdapter) -> dict[str, Any]:
    raw = model.json_schema() if isinstance(model, TypeAdapter) else model.model_json_schema()
    return inline(raw)


def openai_body() -> dict[str, Any]:
    schema = schema_of(DecisionsRequest)
    plugins = [question_type(name) for name in question_type_names() if not built_in_question_type(name)]
    questions = [schema_of(model) for model in BUILT_IN.values()]
    questions += [named(schema_of(qtype.model)) for qtype in plugins if qtype is not None]
    schema["properties"]["questions"]["items"] = {"anyOf": questions}
    schema["properties"]["input"] = {"anyOf": [{"type": "string"}, {"type": "array", "items": schema_of(INPUT_ITEM)}]}
    return schema


def named(schema: dict[str, Any]) -> dict[str, Any]:
    """A plugin question's schema on /v1/decisions, where every question may carry a ``name``."""
    return {**schema, "properties": {"name": {"type": "string"}, **schema.get("properties", {})}}


def jev_body() -> dict[str, Any]:
    schema = schema_of(SystemOneRequest)
    types = [question_type(name) for name in question_type_names()]
    schema["properties"]["questions"]["additionalProperties"] = {
        "anyOf": [schema_of(qtype.model) for qtype in types if qtype is not None]
    }
    return schema


BODIES = {"/v1/decisions": openai_body, "/v1/systemone": jev_body, "/api/alpha/decisions": jev_body}


def document_request_bodies(app: FastAPI) -> None:
    """Make ``app.openapi()`` describe the decision routes' request bodies."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            for path, body in BODIES.items():
                operation = document.get("paths", {}).get(path, {}).get("post")
                if operation is not None:
                    content = {"application/json": {"schema": body()}}
                    operation["requestBody"] = {"required": True, "content": content}
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
