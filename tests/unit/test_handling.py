"""One wire handling for the route and bulk (wire/handling.py): bulk's answers equal the route's, body
for body, refusals included; one request id gives the engine request ids and the response's id; the
decision paths are written once."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from tqdm import tqdm

from vllm.entrypoints.generate.decisions.bulk import Decisions
from vllm.entrypoints.generate.decisions.bulk.batch_file import Writer
from vllm.entrypoints.generate.decisions.bulk.run_batch import (
    DecisionBatch,
    Line,
    Tally,
)
from vllm.entrypoints.generate.decisions.decide import metrics, paths
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.http.api_router import (
    register_decisions_api_router,
    wire_at,
)

from ..cases import JEV_INVALID, OPENAI_INVALID
from .fakes import ScriptedBackend
from .test_wire import JEV_REQUEST, OPENAI_REQUEST, descending

# Bodies as bytes the strict parser refuses or FastAPI's validation would (null, not an object).
RAW = [
    b"null",
    b"[1]",
    b'"text"',
    b"{}",
    b"",
    b"{",
    b'{"a": 1, "a": 2}',
    b"NaN",
    b'{"input": "\\ud800"}',
]


class RecordingBackend(ScriptedBackend):
    """Scripted scores; keeps the engine request id of every read."""

    def __init__(self) -> None:
        super().__init__(descending)
        self.request_ids: list[str] = []

    async def read(self, question, context):
        self.request_ids.append(context.request_id)
        return await super().read(question, context)


@pytest.fixture
async def service():
    settings = Settings.from_env({"VLLM_TYPED_DECISIONS_MAX_BODY_BYTES": "20000"})
    service = DecisionService(settings, RecordingBackend(), "served-model")
    await service.start()
    return service


@pytest.fixture
def app(service):
    app = FastAPI()
    register_decisions_api_router(app)
    app.state.decision_service = service
    return app


async def post(
    app: FastAPI, path: str, content: bytes, request_id: str | None = None
) -> httpx.Response:
    headers = {
        "Content-Type": "application/json",
        **({"X-Request-Id": request_id} if request_id else {}),
    }
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://wire"
    ) as client:
        return await client.post(path, content=content, headers=headers)


def without_created(body):
    """A body with its creation time left out (the second may tick between two calls)."""
    if isinstance(body, dict):
        return {k: without_created(v) for k, v in body.items() if k != "created"}
    return body


BODIES = [OPENAI_REQUEST, JEV_REQUEST] + [
    case[1] for case in OPENAI_INVALID + JEV_INVALID
]


@pytest.mark.parametrize("path", paths.DECISION_PATHS)
async def test_bulk_answers_every_body_as_the_route_does(app, service, path):
    decisions = Decisions(service)
    for i, body in enumerate(BODIES + RAW):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        request_id = f"same-{i}"
        served = await post(app, path, raw, request_id)
        # As bytes, as text, and (where it isn't taken for JSON text) as the parsed value.
        for given in [raw, raw.decode(errors="replace")] + (
            [] if isinstance(body, str | bytes) else [body]
        ):
            result = await decisions.decide(given, path, request_id)
            assert result.status == served.status_code, (path, body)
            assert without_created(result.body) == without_created(served.json()), (
                path,
                body,
            )
            assert result.request_id == request_id


async def test_json_text_is_size_limited_and_a_parsed_value_is_not(app, service):
    long = {
        **OPENAI_REQUEST,
        "input": "x" * 30000,
    }  # over the fixture's 20000-byte limit as JSON
    served = await post(app, paths.DECISIONS, json.dumps(long).encode())
    assert served.status_code == 413
    decisions = Decisions(service)
    result = await decisions.decide(json.dumps(long), paths.DECISIONS)
    assert (result.status, result.body) == (413, served.json())
    assert (
        await decisions.decide(long, paths.DECISIONS)
    ).status == 200  # no bytes to measure


async def test_one_request_id_names_the_engine_reads_and_the_response(app, service):
    served = await post(
        app, paths.DECISIONS, json.dumps(OPENAI_REQUEST).encode(), "client-7"
    )
    assert served.headers["X-Request-Id"] == "client-7"
    assert served.json()["extra"]["id"] == "decisions-client-7"
    assert {
        r.split("-")[0:3] == ["decision", "client", "7"]
        for r in service.backend.request_ids
    } == {True}

    served = await post(app, paths.SYSTEMONE_ALPHA, json.dumps(JEV_REQUEST).encode())
    request_id = served.headers["X-Request-Id"]
    assert served.headers["x-typesafe-request-id"] == request_id
    assert served.json()["id"] == f"systemone-{request_id}"
    assert service.backend.request_ids[-1].startswith(f"decision-{request_id}-")

    result = await Decisions(service).decide(JEV_REQUEST, paths.SYSTEMONE)
    assert result.body["id"] == f"systemone-{result.request_id}"


async def batch_line(service, tmp_path: Path, text: str) -> dict:
    """One run-batch line answered, as its output line."""
    target = tmp_path / "out.jsonl"
    target.unlink(missing_ok=True)
    writer = Writer(target)
    batch = DecisionBatch(
        Decisions(service), lambda url, text: None, writer, Tally(), tqdm(disable=True)
    )
    await batch.answer(Line.parse(1, text))
    writer.close()
    return json.loads(target.read_text())


async def test_a_batch_lines_id_is_its_responses_id(service, tmp_path):
    record = await batch_line(
        service,
        tmp_path,
        json.dumps({"custom_id": "c", "url": paths.DECISIONS, "body": OPENAI_REQUEST}),
    )
    request_id = record["response"]["request_id"]
    assert record["id"] == f"batch-L1-{request_id}"
    assert record["response"]["body"]["extra"]["id"] == f"decisions-{request_id}"


async def test_a_batch_lines_body_is_taken_as_parsed_and_the_line_is_size_limited(
    service, tmp_path
):
    # A body that is a JSON string stays a string: it is not read as a request's JSON text.
    text = json.dumps(
        {"custom_id": "c", "url": paths.SYSTEMONE, "body": json.dumps(JEV_REQUEST)}
    )
    record = await batch_line(service, tmp_path, text)
    assert record["response"]["status_code"] == 422
    assert record["response"]["body"]["detail"][0]["loc"] == ["body"]
    long = {
        **OPENAI_REQUEST,
        "input": "x" * 20000,
    }  # over the fixture's 20000-byte limit as a line
    record = await batch_line(
        service,
        tmp_path,
        json.dumps({"custom_id": "c", "url": paths.DECISIONS, "body": long}),
    )
    assert record["response"]["status_code"] == 413
    assert (
        "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES"
        in record["response"]["body"]["error"]["message"]
    )


def test_the_decision_paths_are_the_routes_the_key_check_and_the_metrics_know(app):
    routed = {
        route.path
        for route in app.routes
        if getattr(route, "methods", None) == {"POST"}
    }
    assert routed == set(paths.DECISION_PATHS) == set(metrics.ENDPOINTS)
    # The key check knows a decision request by the route that answers it (auth.py), not by its path.
    assert all(
        route.checks_decision_authorization
        for route in app.routes
        if route.path in routed
    )
    for path in paths.DECISION_PATHS:
        assert path in wire_at(path).paths
    with pytest.raises(ValueError, match="not a decision endpoint"):
        wire_at("/v1/chat/completions")


@pytest.mark.parametrize("path", paths.DECISION_PATHS)
async def test_a_fault_is_a_500_in_the_wires_shape_on_the_route_and_in_bulk_with_no_text(
    app, service, path, monkeypatch
):
    """A bug past validation answers the route and bulk alike: a 500 in the wire's own error shape naming
    the request id, its exception's text (a path, a secret) only in the log."""

    async def faulty(*args):
        raise RuntimeError("token sk-7 in /home/op/app.py")

    monkeypatch.setattr(service, "decide", faulty)
    body = json.dumps(
        OPENAI_REQUEST if path == paths.DECISIONS else JEV_REQUEST
    ).encode()
    served = await post(app, path, body, "fault-1")
    result = await Decisions(service).decide(body, path, "fault-1")
    assert served.status_code == result.status == 500 and served.json() == result.body
    assert (
        "fault-1" in served.text
        and "sk-7" not in served.text
        and "/home" not in served.text
    )
    assert ("detail" if path != paths.DECISIONS else "error") in served.json()
