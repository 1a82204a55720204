"""Fuzzing against the real server: requests generated from its own /openapi.json (and each with one
mistake), hostile raw bodies and the corpus of cases that once failed, on both endpoints and the
alias. No 5xx; every 4xx names a field or a setting; every 200 is well formed. (tests/unit/test_fuzz.py
runs thousands more in process.)"""

from __future__ import annotations

import httpx
import pytest

from ..fuzzing import HOSTILE, corpus_cases, generated_cases, judge, request_schema


@pytest.fixture(scope="module")
def openapi(server):
    return httpx.get(f"{server.url}/openapi.json", timeout=30).json()


def test_the_openapi_document_describes_requests_and_responses(openapi):
    for path in ("/v1/decisions", "/v1/systemone", "/api/alpha/decisions"):
        schema = request_schema(openapi, path)
        assert "questions" in schema["properties"] and "$ref" not in str(schema)
        responses = openapi["paths"][path]["post"]["responses"]
        assert {"200", "401", "503"} <= set(responses), path
    kinds = {
        q["properties"]["type"].get("const")
        for q in request_schema(openapi, "/v1/decisions")["properties"]["questions"][
            "items"
        ]["anyOf"]
    }
    assert {"predicate", "choice", "score"} <= kinds
    jev_types = request_schema(openapi, "/v1/systemone")["properties"]["questions"][
        "additionalProperties"
    ]["anyOf"]
    assert {"noul", "choice", "score"} <= {
        q["properties"]["type"].get("const") for q in jev_types
    }
    components = openapi["components"]["schemas"]
    assert {
        "DecisionsResponse",
        "SystemOneResponse",
        "ErrorResponse",
        "JevError",
    } <= set(components)


@pytest.mark.parametrize(
    "path", ["/v1/decisions", "/v1/systemone", "/api/alpha/decisions"]
)
def test_generated_and_hostile_requests(server, openapi, path):
    schema = request_schema(openapi, path)
    cases = list(generated_cases(schema, path, count=120, seed=11)) + [
        (path, body) for path_, body in corpus_cases()
    ]
    assert len(cases) >= 120 + len(HOSTILE)
    problems = []
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for case_path, body in cases:
            response = client.post(
                case_path, content=body, headers={"content-type": "application/json"}
            )
            if (problem := judge(case_path, body, response)) is not None:
                problems.append(problem)
    assert not problems, (
        f"{len(problems)} of {len(cases)} cases failed; first ones:\n"
        + "\n".join(problems[:5])
    )
