"""The canvas backend on a real server that can't serve it (a generative model, no canvas patch): a
request that names it is refused with the reason (a 400: retrying can't help), and the server answers the next one as before. The
canvas reads themselves are tested against transformers' DiffusionGemma (tests/unit/test_canvas_backend.py):
vLLM (0.30 and 0.32) serves DiffusionGemma only on a GPU."""

from __future__ import annotations

from vllm.entrypoints.generate.decisions.decide.vllm_versions import (
    BUILT_IN_CANVAS_READ,
)

from .conftest import answered

BODY = {
    "model": "m",
    "input": "The parcel is late.",
    "questions": [{"type": "predicate", "instructions": "Late?"}],
}


def test_naming_the_canvas_backend_here_is_a_400_that_says_why(client, server):
    response = client.post(
        "/v1/decisions", json={**BODY, "extra": {"backend": "canvas"}}
    )
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "backend 'canvas' could not start for this model" in message
    assert "needs a diffusion model (DiffusionGemma)" in message
    assert (
        "patches/00572" in message
    ) is not BUILT_IN_CANVAS_READ  # vLLM 0.32 reads canvases itself
    assert answered(server, "/v1/decisions", BODY)["answers"][0]["type"] == "predicate"
