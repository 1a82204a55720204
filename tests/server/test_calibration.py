"""Startup calibration on a real server with a small question file: 503 while it runs, answers with
the fitted T, the saved result reused on restart, a failure -> the default T (and, where the model's
scores caused it, no measuring again on restart).
The first two servers run two API-server processes (``--api-server-count 2``): the calibration and the
startup check are done once and shared, both workers answer both endpoints alike, and a restart loads
the saved result in both."""

from __future__ import annotations

import json
import re
import time
from importlib import resources

import httpx
import pytest

from ..conftest import model_path
from .conftest import VllmServer, all_workers_ready, answered, workers_serving
from .test_metrics import Samples, decision_samples, total

QUESTION = {
    "model": "m",
    "input": "The sky is blue.",
    "questions": [{"type": "predicate", "instructions": "Blue?"}],
}


def bundled_lines(count: int) -> list[str]:
    """The last ``count`` questions of the bundled set. (SmolLM2-135M is near chance on the set's first
    questions, which puts the fitted T at the range's edge: a failure by design, tested below.)"""
    text = (
        resources.files("vllm.entrypoints.generate.decisions.calibration")
        .joinpath("bundled.jsonl")
        .read_text()
    )
    return text.splitlines()[-count:]


def start(
    tmp_path,
    name: str,
    question_file,
    saved_dir,
    workers: int = 1,
    audits: list[dict] | None = None,
    **env: str,
) -> tuple[VllmServer, list[httpx.Response]]:
    """Start a server and poll a decision until every worker is ready; returns the 503s seen on the way
    (and appends each answer's audit to ``audits``)."""
    # One read per question (debias off): calibration reading as requests do (rotate) is a unit test.
    env = {
        "VLLM_ENABLE_TYPED_DECISIONS": "1",
        "VLLM_TYPED_DECISIONS_CALIBRATION": str(question_file),
        "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(saved_dir),
        "VLLM_TYPED_DECISIONS_DEBIAS": "off",
        **env,
    }
    args = ("--api-server-count", str(workers)) if workers > 1 else ()
    server = VllmServer(
        model_path("smollm2-135m-instruct"), tmp_path / f"{name}.log", env, *args
    )
    starting: list[httpx.Response] = []

    def ready(s: VllmServer) -> bool:
        response = httpx.post(f"{s.url}/v1/decisions", json=QUESTION, timeout=30)
        if response.status_code == 503:
            starting.append(response)
        if response.status_code == 200 and audits is not None:
            audits.append(response.json()["answers"][0]["extra"]["audit"])
        return response.status_code == 200 and (
            workers == 1 or all_workers_ready(s, workers)
        )

    server.wait(ready)
    return server, starting


def audit(server: VllmServer, **extra) -> dict:
    response = httpx.post(
        f"{server.url}/v1/decisions", json={**QUESTION, "extra": extra}, timeout=60
    )
    assert response.status_code == 200, response.text
    return response.json()["answers"][0]["extra"]["audit"]


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("calibration-results")


# An operator's question asked about many inputs (issue 40): 20 of the 55 yes/no lines ask it instead,
# about the same inputs, so every count below stays. All of them are in English. Its lines ask its
# answers for a precision of their own, another than the one asked of every yes/no answer.
ENGLISH = {"type": "noul", "instructions": "Is this text written in English?"}
ENGLISH_PRECISION = 0.7


def with_one_question_labelled_often(lines: list[str], count: int = 20) -> list[str]:
    """``lines`` with their last ``count`` yes/no questions replaced by :data:`ENGLISH` (answer yes)."""
    nouls = [
        i
        for i, line in enumerate(lines)
        if json.loads(line)["question"]["type"] == "noul"
    ]
    out = list(lines)
    for i in nouls[-count:]:
        item = json.loads(lines[i])
        item.update(question=ENGLISH, expected="yes", id=f"{item['id']}-english")
        item["precision"] = ENGLISH_PRECISION
        out[i] = json.dumps(item)
    return out


def test_calibrates_at_startup_then_reuses_the_saved_result(tmp_path, saved_dir):
    questions = tmp_path / "questions.jsonl"
    # 55 yes/no (20 of them one question, ENGLISH), 37 choice (too few for a fit of its own: the
    # server-wide T serves it) and 58 score.
    questions.write_text(
        "\n".join(with_one_question_labelled_often(bundled_lines(150))) + "\n"
    )

    audits: list[dict] = []
    # A precision asked of yes/no answers (issue 40): each one says whether it clears the threshold.
    served = {"VLLM_TYPED_DECISIONS_PRECISION": "noul=0.8"}
    # A labels file the server watches while serving (issue 40): empty at startup.
    labels = tmp_path / "labels.jsonl"
    labels.write_text("")
    served["VLLM_TYPED_DECISIONS_LABELS"] = str(labels)
    first, starting = start(
        tmp_path, "first", questions, saved_dir, 2, audits, **served
    )
    try:
        first_pass_then_full(first, audits)
        shared_startup_work(first, saved_dir)
        counted = decision_samples(first)  # before both workers answer (metrics.py)
        both_workers_answer_alike(first)
        health = httpx.get(f"{first.url}/health", timeout=10)
        assert health.status_code == 200
        assert starting, "decision requests answer 503 while calibration runs"
        startup_progress(first, starting)
        (saved,) = saved_dir.glob("calibration-*.json")
        record = json.loads(saved.read_text())
        honest_key(record["key"])
        per_type_fits(first, record)
        metrics_of_both_workers(first, counted, record)
        answer = audit(first)  # a predicate: a noul question
        noul = record["by_type"]["noul"]
        assert (answer["calibration_stage"], answer["calibration_reads"]) == (
            "full",
            record["question_reads"],
        )
        assert answer["temperature_source"] == "calibrated"
        assert answer["temperature_scope"] == ("server" if noul["fallback"] else "noul")
        assert answer["calibration_temperature"] == pytest.approx(
            noul["applied_temperature"]
        )
        assert record["questions"]["used"] + len(record["questions"]["skipped"]) == 150
        own_map(first, record)
        labels_while_serving(first, labels, saved_dir)
        assert "decision calibration: T=" in first.log.read_text()
        overridden = audit(first, calibration_temperature=3.0)
        assert (
            overridden["calibration_temperature"],
            overridden["temperature_source"],
        ) == (3.0, "request")
        assert overridden["temperature_scope"] == "request"
    finally:
        first.stop()

    again, _ = start(tmp_path, "again", questions, saved_dir, workers=2, **served)
    try:
        log = again.log.read_text()
        assert (
            log.count("loaded from a saved result)") == 2
            and "decision calibration saved to" not in log
        )
        assert audit(again)["calibration_temperature"] == pytest.approx(
            noul["applied_temperature"]
        )
        assert log.count("decision calibration (choice): ") == 2, (
            "every type's fit is loaded too"
        )
        assert log.count("question maps of refit 1 loaded from a saved result") == 2
        restored = in_english(again)["extra"]["audit"]["question_map"]
        assert (restored["source"], restored["version"]) == ("labels file", 1)
    finally:
        again.stop()

    # A changed question file or debias setting is a new key, measured again; a corrupt file or too few
    # answers give the default; calibration reads as requests do (rotate): tests/unit/test_calibration_startup.py.
    # One failure is served below.


def own_map(server: VllmServer, record: dict) -> None:
    """The question the file labels 20 times has a map of its own (its labels all say yes, which
    SmolLM2's reads alone don't), saved and logged, and its in-context examples measured; asked on
    the Jev wire, its answer uses the examples where they were kept, else the map, and its audit
    says which; a question without one keeps its type's reads."""
    (key,) = record["question_maps"]
    assert json.loads(key)[:2] == ["noul", ENGLISH["instructions"]]
    own = record["question_maps"][key]
    assert own["labels"] == 20 and own["gain"][0] > 0
    assert (
        "decision calibration (noul, 'Is this text written in English?'): a map of its own kept "
        "from 20 labels" in server.log.read_text()
    )
    # Its 20 labels read again on the engine with 4 in-context examples from the other folds,
    # measured against its reads without them, saved and logged whether kept or not.
    shown = record["question_examples"][key]
    assert shown["labels"] == 20 and len(shown["examples"]) == 4
    assert {example["answer"] for example in shown["examples"]} == {"true"}
    kept = shown["gain"][0] > 0 and shown["accuracy"] >= shown["type_accuracy"]
    assert (
        "decision calibration (noul, 'Is this text written in English?'): 4 in-context "
        f"examples {'kept' if kept else 'not kept'} over 20 labels"
        in server.log.read_text()
    )
    answer = in_english(server, ENGLISH)
    audit = answer["extra"]["audit"]
    if kept:  # asked with the examples, mapped by the map fitted on such reads
        assert audit["temperature_scope"] == "noul:examples"
        assert audit["calibration_temperature"] == pytest.approx(1.0 / shown["scale"])
        assert audit["examples"]["examples"] == 4 and "question_map" not in audit
    else:
        assert audit["temperature_scope"] == "noul:question" and "examples" not in audit
        assert audit["calibration_temperature"] == pytest.approx(1.0 / own["scale"])
        assert audit["question_map"]["labels"] == 20
    assert answer["noul"] > 0.5, answer
    # Its answers are judged by the threshold fitted for the precision its lines ask, on its own
    # labels read as it is served (with the examples where they were kept).
    own_rule = shown["abstention"] if kept else record["question_abstention"][key]
    assert (own_rule["scope"], own_rule["precision_asked"]) == (
        "question",
        ENGLISH_PRECISION,
    )
    judged(answer, own_rule)
    # Every other yes/no answer by the type's threshold for the precision the setting asks, fitted
    # on the held-out labels and saved.
    rule = record["abstention"]["noul"]
    assert rule["precision_asked"] == 0.8 and record["key"]["precision"] == {
        "noul": 0.8
    }
    judged(in_english(server), rule)


def judged(answer: dict, rule: dict) -> None:
    """``answer`` (a yes/no one) says it was judged by ``rule``, and whether it clears it."""
    verdict = answer["extra"]["abstention"]
    assert (verdict["scope"], verdict["precision"], verdict["threshold"]) == (
        rule["scope"],
        rule["precision_asked"],
        rule["threshold"],
    )
    top = max(answer["noul"], 1 - answer["noul"])
    assert verdict["abstain"] == (rule["threshold"] is None or top < rule["threshold"])


# A question the labels file labels while the server runs (its startup file never asks it).
IN_ENGLISH = {"type": "noul", "instructions": "Is this text in English?"}


def in_english(server: VllmServer, question: dict = IN_ENGLISH) -> dict:
    """The answer to ``question`` about an English sentence, on the Jev wire, with the full audit."""
    response = httpx.post(
        f"{server.url}/v1/systemone",
        json={
            "state": "The meeting moved to Thursday.",
            "questions": {"english": question},
            "extra": {"detail": "full"},
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response.json()["answers"]["english"]


def labels_while_serving(server: VllmServer, labels, saved_dir) -> None:
    """20 labelled lines of a new question appended to the watched labels file: within two minutes
    an answer about it uses the map refitted from them (version 1, from the labels file), logged and
    saved beside the calibration record, read by one API-server process and loaded by the other;
    before, its type's reads."""
    before = in_english(server)["extra"]["audit"]
    assert "question_map" not in before
    assert before["temperature_scope"] != "noul:question"
    states = [json.loads(line)["state"] for line in bundled_lines(20)]
    with labels.open("a") as out:
        for i, state in enumerate(states):
            line = {"state": state, "question": IN_ENGLISH, "expected": "yes"}
            out.write(json.dumps({**line, "group": f"g{i}"}) + "\n")
    deadline = time.monotonic() + 120
    while True:
        audit = in_english(server)["extra"]["audit"]
        if "question_map" in audit or time.monotonic() > deadline:
            break
        time.sleep(2)
    qmap = audit.get("question_map")
    assert qmap is not None, "no refit from the labels file within 120 s"
    assert (qmap["source"], qmap["version"], qmap["labels"]) == ("labels file", 1, 20)
    assert audit["temperature_scope"] == "noul:question"
    # One of the two API-server processes read the 20 lines and refitted; the other loaded its refit.
    deadline = time.monotonic() + 60
    while "loaded from another API-server process" not in server.log.read_text():
        assert time.monotonic() < deadline, "the other process never loaded the refit"
        time.sleep(1)
    log = server.log.read_text()
    assert log.count("20 new lines read (20 in all") == 1, log[-3000:]
    assert log.count("refit 1 from ") == 2
    (saved,) = saved_dir.glob("labels-*.json")
    assert json.loads(saved.read_text())["version"] == 1


def first_pass_then_full(server: VllmServer, audits: list[dict]) -> None:
    """The calibrating process answered on its first pass (all 150 questions, a file this small, in
    the first layout only, without content-free reads) before the full calibration was done, its audit saying
    so; then the full one replaced it, without reading those questions again, and every answer since
    says so."""
    log = server.log.read_text(errors="replace")
    assert audits[0]["calibration_stage"] == "first pass", audits[0]
    reads = audits[0]["calibration_reads"]
    assert 100 <= reads <= 150, "at most 150 questions in letters, most answered"
    assert "decision first-pass calibration: T=" in log
    assert (
        log.count(
            f"decisions ready after calibration's first pass ({reads} question reads"
        )
        == 1
    )
    assert log.count("the full calibration replaces the first pass") == 1
    assert re.search(
        r"decision calibration: reading 150 questions in 2 label layouts \(letters, words\), 300 "
        r"reads in all; after the first pass, \d+ to go \(its reads reused, given their "
        r"content-free reads where they are compared\)",
        log,
    )
    assert re.search(
        r"decision calibration \(full, in the background\): \d+ of \d+ reads", log
    )
    later = {
        (answer["calibration_stage"], answer["calibration_reads"])
        for answer in [audit(server) for _ in range(4)]
    }
    (stage, full_reads), *others = later
    assert not others and stage == "full" and reads < full_reads <= 300


def honest_key(key: dict) -> None:
    """The saved key names what the reads depend on (each ingredient changing it: tests/unit/test_calibration_key.py):
    the model's files by content, the tokenizer, chat template and its kwargs, vLLM, what the startup check
    found (fp32 reads here), the self-check threshold and the prompt's derived render version."""
    import vllm
    from vllm.entrypoints.generate.decisions.decide.prompting.prompt import (
        RENDER_VERSION,
    )

    assert re.fullmatch(r"[0-9a-f]{64}", key["model_files_sha256"]), key
    assert re.fullmatch(r"[0-9a-f]{64}", key["chat_template_sha256"])
    assert (
        key["chat_template_kwargs"]["add_generation_prompt"] is True
        and key["tokenizer"] == key["model_path"]
    )
    assert (
        key["vllm_version"] == vllm.__version__
        and key["render_version"] == RENDER_VERSION
    )
    assert key["min_option_mass"] == 0.5 and isinstance(
        key["reads"]["fp32_reads"], bool
    )


def startup_progress(server: VllmServer, starting: list[httpx.Response]) -> None:
    """While starting, each 503 says which step runs (and, in the process calibrating, how far it is),
    with a Retry-After of 5 to 15 s; the log says when calibration starts, what it reads, and its progress.
    (The message's forms, and a waiting process's, are unit tests: tests/unit/test_readiness.py.)"""
    messages = [r.json()["error"]["message"] for r in starting]
    assert all(5 <= int(r.headers["retry-after"]) <= 15 for r in starting), [
        r.headers for r in starting
    ]
    waiting = r"waiting for another API-server process's (?P=step)"
    counted = r"\d+ of 150 first-pass reads, .+"
    step = rf"(?P<step>self-check|calibration)(, {waiting}|, {counted})?"
    assert all(
        re.fullmatch(rf"decisions are starting(: {step})?; retry shortly", m)
        for m in messages
    ), messages
    assert any(m.startswith("decisions are starting: calibration") for m in messages), (
        messages
    )
    log = server.log.read_text(errors="replace")
    assert (
        log.count(
            "decision calibration: reading a first pass: 150 questions in letters labels without "
            "content-free reads (every question; answers start when it is fitted); time left "
            "unknown until the first 8 reads"
        )
        == 1
    ), "one process calibrates"
    assert re.search(
        r"decision calibration: 8 of 150 first-pass reads, about \d+ s left", log
    )


def per_type_fits(server: VllmServer, record: dict) -> None:
    """The saved result holds a fit for each type in the file, each logged on its own line, and each
    type's reads: both label layouts measured with every prior correction (VLLM_TYPED_DECISIONS_PRIOR
    auto, the default), the 37 choice questions too few to choose by (read in letters, no correction)."""
    log = server.log.read_text(errors="replace")
    assert (
        record["key"]["scheme"] == "per-type-prior-question-maps-v3"
        and record["key"]["prior"] == "auto"
    )
    assert set(record["reads"]) == {"noul", "score"}
    for name, reads in record["reads"].items():
        assert (
            set(reads["by_layout"]) == {"letters", "words"}
            and reads["layout"] in reads["by_layout"]
        )
        for layout, choice in reads["by_layout"].items():
            assert set(choice["candidates"]) == {
                "off",
                "content-free",
                "fitted",
                "content-free+fitted",
            }
            assert (
                choice["mode"] in choice["candidates"]
                and f"decision reads ({name}, {layout}): " in log
            )
        assert f"decision reads ({name}): {reads['layout']} labels kept" in log
    assert set(record["by_type"]) == {"noul", "choice", "score"}
    for name, fit in record["by_type"].items():
        assert fit["used"] > 0 and f"decision calibration ({name}): " in log
        if fit["fallback"] is None:
            assert fit["applied_temperature"] == (
                fit["temperature"] if fit["kept"] else 1.0
            )
        else:
            assert fit["applied_temperature"] == record["applied_temperature"]
            assert (
                f"decision calibration ({name}): {fit['fallback']}, server-wide T applies"
                in log
            )


def metrics_of_both_workers(server: VllmServer, before: Samples, record: dict) -> None:
    """/metrics sums the decision counters over both API-server processes (both answered some of the 12
    requests on each endpoint), and shows the calibrated temperatures, server-wide and per type."""
    after = decision_samples(server)
    requests = "vllm:decision_requests_total"
    for path in ("/v1/decisions", "/v1/systemone"):
        ok = {"endpoint": path, "outcome": "ok"}
        assert total(after, requests, **ok) - total(before, requests, **ok) == 12, path
    temperature, source = (
        "vllm:decision_calibration_temperature",
        "vllm:decision_calibration_temperature_source",
    )
    assert total(after, temperature, scope="server") == pytest.approx(
        record["applied_temperature"]
    )
    assert total(after, source, scope="server", source="calibrated") == 1
    for name, fit in record["by_type"].items():
        if fit["fallback"] is None:  # a fit of its own
            assert total(after, temperature, scope=name) == pytest.approx(
                fit["applied_temperature"]
            ), name
        else:
            assert not any(
                n == temperature and ("scope", name) in labels for n, labels in after
            ), name


def shared_startup_work(server: VllmServer, saved_dir) -> None:
    """One of the two API-server processes calibrated and ran the startup check; the other took both."""
    log = server.log.read_text(errors="replace")
    assert log.count("decision calibration saved to") == 1
    # measured once
    assert len(re.findall(r"decision calibration: T=\S+ .*, \d+ s\)", log)) == 1
    assert log.count("loaded from a saved result)") == 1
    assert (
        log.count(
            "decision startup check: adopting the result of another API-server process"
        )
        == 1
    )
    assert log.count("decision prompt: instructions in a system message") == 2
    assert len(list(saved_dir.glob("calibration-*.json"))) == 1


def both_workers_answer_alike(server: VllmServer) -> None:
    jev = {
        "state": QUESTION["input"],
        "questions": {"blue": {"type": "noul", "instructions": "Blue?"}},
    }
    probabilities = set()
    # a new connection each time: the kernel spreads them over both workers
    for _ in range(12):
        probabilities.add(
            answered(server, "/v1/decisions", QUESTION)["answers"][0]["probability"]
        )
        answered(server, "/v1/systemone", jev)
    both = {"ApiServer_0", "ApiServer_1"}
    assert (
        workers_serving(server, "/v1/decisions")
        == workers_serving(server, "/v1/systemone")
        == both
    )
    # One engine answers for both; a read over cached prefix blocks may differ from a fresh one by a little
    # (docs/wire-formats.md, What the numbers mean), so alike means within that.
    assert max(probabilities) - min(probabilities) < 0.05, (
        f"the workers answered differently: {probabilities}"
    )


def contradicting_lines(count: int) -> list[str]:
    """``count`` inputs, each asked one yes/no question twice with opposite answers: no T makes those
    likelier than a coin does, so the fit runs to the range's top on any model and any CPU."""
    question = {"type": "noul", "instructions": "Is this message urgent?"}
    return [
        json.dumps(
            {
                "state": json.loads(line)["state"],
                "question": question,
                "expected": expected,
                "group": f"{i}-{expected}",
            }
        )
        for i, line in enumerate(bundled_lines(count))
        for expected in ("yes", "no")
    ]


def test_a_failure_gives_the_default_temperature_a_warning_and_no_remeasuring(
    tmp_path, saved_dir
):
    questions = tmp_path / "questions.jsonl"
    questions.write_text("\n".join(contradicting_lines(30)) + "\n")
    warning = (
        "decision calibration failed, T=1.0 (default): the fitted T=20.000 is at the edge of "
        "[0.05, 20]"
    )

    def answers_at_the_default(server: VllmServer) -> None:
        answer = audit(server)
        assert (answer["calibration_temperature"], answer["temperature_source"]) == (
            1.0,
            "default",
        )
        assert answer["temperature_scope"] == "server"

    server, _ = start(tmp_path, "failing", questions, saved_dir)
    try:
        deadline = time.monotonic() + 10
        while warning not in server.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert warning in server.log.read_text()
        answers_at_the_default(server)
    finally:
        server.stop()
    # The model's scores would put T there again: a restart reads nothing and says why.
    server, _ = start(tmp_path, "failing-again", questions, saved_dir)
    try:
        log = server.log.read_text()
        assert (
            "decision calibration: the saved result for this deployment is a failure, T=1.0 "
            "(default): the fitted T=20.000 is at the edge" in log
        ), log[-3000:]
        assert "decision calibration: reading" not in log
        answers_at_the_default(server)
    finally:
        server.stop()
