"""Fuzzing against the real server: requests generated from its own /openapi.json (and each with one
mistake), hostile raw bodies and the corpus of cases that once failed, on both endpoints and the
alias. No 5xx; every 4xx names a field or a setting; every 200 is well formed. (tests/unit/test_fuzz.py
runs thousands more in process.)"""

from __future__ import annotations

import httpx
import pytest

from ..fuzzing import HOSTILE, corpus_cases, generated_cases, judge


@pytest.fixture(scope="module")
def openapi(server):
    return httpx.get(f"{server.url}/openapi.json", timeout=30).json()


def test_the_openapi_document_describes_both_request_bodies(openapi):
    for path in ("/v1/decisions", "/v1/systemone", "/api/alpha/decisions"):
        schema = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert "questions" in schema["properties"] and "$ref" not in str(schema)
    openai_questions = openapi["paths"]["/v1/decisions"]["post"]["requestBody"]["content"]["application/json"]
    kinds = {
        q["properties"]["type"].get("const")
        for q in openai_questions["schema"]["properties"]["questions"]["items"]["anyOf"]
    }
    assert {"predicate", "choice", "score"} <= kinds


@pytest.mark.parametrize("path", ["/v1/decisions", "/v1/systemone", "/api/alpha/decisions"])
def test_generated_and_hostile_requests(server, openapi, path):
    schema = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    cases = list(generated_cases(schema, path, count=120, seed=11)) + [(path, body) for path_, body in corpus_cases()]
    assert len(cases) >= 120 + len(HOSTILE)
    problems = []
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for case_path, body in cases:
            response = client.post(case_path, content=body, headers={"content-type": "application/json"})
            if (problem := judge(case_path, body, response)) is not None:
                problems.append(problem)
    assert not problems, f"{len(problems)} of {len(cases)} cases failed; first ones:\n" + "\n".join(problems[:5])
