"""Startup calibration around the maths: question files, saved results, failures, with a scripted backend."""

from __future__ import annotations

import json
import math
import random
import re

import pytest

from vllm.entrypoints.generate.decisions.calibration import (
    deployment_lock,
    question_file,
)
from vllm.entrypoints.generate.decisions.calibration import record as saved_record
from vllm.entrypoints.generate.decisions.calibration.calibrate import (
    startup_calibration,
)
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.decide.temperature import (
    Temperature,
)

from .fakes import ScriptedBackend

MODEL = {
    "model": "m",
    "model_path": "/m",
    "revision": None,
    "quantization": None,
    "dtype": "bfloat16",
}


def expected_of(question):
    return int(question.instructions.split("#")[1].split()[0])


def overconfident(question):
    """Scores that favour the right answer 60% of the time but claim near-certainty: T should grow."""
    rng = random.Random(question.instructions)
    right = expected_of(question)
    pick = right if rng.random() < 0.6 else (right + 1) % len(question.options)
    return [8.0 if i == pick else 0.0 for i in range(len(question.options))]


def write_questions(path, count, groups=40):
    with path.open("w") as f:
        for i in range(count):
            expected = i % 3
            f.write(
                json.dumps(
                    {
                        "state": f"state {i}",
                        "group": f"g{i % groups}",
                        "id": f"q{i}",
                        "expected": expected,
                        "question": {
                            "type": "score",
                            "instructions": f"level #{expected} (q{i})",
                            "criteria": ["low", "mid", "high"],
                        },
                    }
                )
                + "\n"
            )
    return path


def calibrated(question):
    """Yes/no scores whose stated confidence is right as often as it claims: no T should be kept."""
    rng = random.Random(question.instructions)
    right = expected_of(question)
    stated = rng.uniform(0.55, 0.95)
    pick = right if rng.random() < stated else 1 - right
    return [math.log(stated) if i == pick else math.log(1 - stated) for i in range(2)]


def always_wrong(question):
    return [
        0.0 if i == expected_of(question) else 2.0 for i in range(len(question.options))
    ]


def write_mixed(path, counts, groups=40):
    """``counts`` questions of each type; each question's correct index is in its instructions (#n)."""
    lines = []
    for kind, count in counts.items():
        for _ in range(count):
            n = len(lines)
            right = n % (2 if kind == "noul" else 3)
            question = {"type": kind, "instructions": f"{kind} #{right} (q{n})"}
            if kind == "noul":
                expected = ["yes", "no"][right]
            elif kind == "choice":
                question["criteria"], expected = (
                    {"a": "first", "b": "second", "c": "third"},
                    "abc"[right],
                )
            else:
                question["criteria"], expected = ["low", "mid", "high"], right
            lines.append(
                json.dumps(
                    {
                        "state": f"state {n}",
                        "group": f"g{n % groups}",
                        "id": f"q{n}",
                        "expected": expected,
                        "question": question,
                    }
                )
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def settings(tmp_path, source, prior="off", examples=0):
    """The temperature tests read without a prior correction (test_prior_calibration.py covers those)
    and count reads without in-context examples (their files ask one question many times, which the
    examples would read again; test_examples.py covers them)."""
    return Settings.from_env(
        {
            "VLLM_TYPED_DECISIONS_CALIBRATION": str(source),
            "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(tmp_path / "saved"),
            "VLLM_TYPED_DECISIONS_PRIOR": prior,
            "VLLM_TYPED_DECISIONS_EXAMPLES": str(examples),
        }
    )


async def calibrated_temperatures(backend, configured, model):
    return (await startup_calibration(backend, configured, model)).temperatures


async def test_fits_saves_and_reuses(tmp_path, caplog):
    source = write_questions(tmp_path / "q.jsonl", 200)
    backend = ScriptedBackend(overconfident)
    first = await calibrated_temperatures(backend, settings(tmp_path, source), MODEL)
    assert (first.server.source, first.server.scope) == (
        "calibrated",
        "server",
    ) and first.server.value > 2
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    record = json.loads(saved.read_text())
    assert (
        record["kept"]
        and record["questions"]["used"] == 200
        and record["key"]["questions_sha256"]
    )
    assert record["ece_calibrated_interval"][1] < record["ece_raw_interval"][0]
    assert (
        record["key"]["scheme"]
        == saved_record.SCHEME
        == "per-type-prior-question-maps-v3"
    )
    # One type only: its own fit is the server-wide one, on the same questions.
    assert first.for_type("score") == Temperature(
        first.server.value, "calibrated", "score"
    )
    assert record["by_type"]["score"]["temperature"] == record["temperature"]

    reads = []
    backend.score = lambda q: reads.append(q) or overconfident(q)
    again = await calibrated_temperatures(backend, settings(tmp_path, source), MODEL)
    assert again == first and reads == [], (
        "a saved result for the same deployment is reused"
    )

    # a changed question file: a new key, a new calibration
    write_questions(source, 199)
    changed = await calibrated_temperatures(backend, settings(tmp_path, source), MODEL)
    assert changed.server.source == "calibrated" and len(reads) == 199
    assert len(list((tmp_path / "saved").glob("calibration-*.json"))) == 2


async def test_each_question_type_gets_its_own_temperature(tmp_path, caplog):
    source = write_mixed(
        tmp_path / "q.jsonl", {"noul": 150, "choice": 150, "score": 20}
    )
    backend = ScriptedBackend(
        lambda q: calibrated(q) if q.qtype.name == "noul" else overconfident(q)
    )
    first = await calibrated_temperatures(backend, settings(tmp_path, source), MODEL)
    server = first.server
    assert (server.source, server.scope) == (
        "calibrated",
        "server",
    ) and server.value > 2
    choice = first.for_type("choice")
    assert (
        (choice.source, choice.scope) == ("calibrated", "choice")
        and choice.value > 2
        and choice != server
    )
    assert first.for_type("noul") == Temperature(1.0, "calibrated", "noul"), (
        "measured: no correction needed"
    )
    assert first.for_type("score") == server, (
        "too few score questions: the server-wide fit"
    )
    assert first.for_type("a-plugin-type") == server, (
        "a type never calibrated: the server-wide fit"
    )

    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    record = json.loads(saved.read_text())
    assert (
        record["questions"]["used"] == 320
        and record["applied_temperature"] == server.value
    )
    by_type = record["by_type"]
    assert list(by_type) == ["noul", "choice", "score"]
    assert (
        by_type["choice"]["kept"]
        and by_type["choice"]["fallback"] is None
        and by_type["choice"]["used"] == 150
    )
    assert (
        by_type["choice"]["ece_calibrated_interval"][1]
        < by_type["choice"]["ece_raw_interval"][0]
    )
    assert (
        by_type["choice"]["applied_temperature"]
        == by_type["choice"]["temperature"]
        == choice.value
    )
    noul = by_type["noul"]
    assert (
        not noul["kept"]
        and noul["applied_temperature"] == 1.0
        and 0.6 < noul["temperature"] < 1.6
    )
    assert by_type["score"] == {
        "temperature": None,
        "kept": None,
        "ece_raw": None,
        "ece_raw_interval": None,
        "ece_calibrated": None,
        "ece_calibrated_interval": None,
        "used": 20,
        "applied_temperature": server.value,
        "fallback": "too few questions (20 < 50)",
    }
    assert re.search(
        r"decision calibration \(choice\): T=\d+\.\d\d kept \(ECE 0\.\d+ -> 0\.\d+, 150 questions\)",
        caplog.text,
    )
    assert re.search(
        r"decision calibration \(noul\): T=\d\.\d\d not kept, T=1\.0 \(ECE", caplog.text
    )
    assert (
        "decision calibration (score): too few questions (20 < 50), server-wide T applies"
        in caplog.text
    )

    caplog.clear()
    reads = []
    backend.score = lambda q: reads.append(q) or overconfident(q)
    again = await calibrated_temperatures(backend, settings(tmp_path, source), MODEL)
    assert again == first and reads == [], "every fit is restored from the saved result"
    assert (
        "loaded from a saved result)" in caplog.text
        and "decision calibration (choice): T=" in caplog.text
    )


async def test_an_edge_fit_for_one_type_falls_back_with_a_warning(tmp_path, caplog):
    source = write_mixed(tmp_path / "q.jsonl", {"choice": 200, "score": 60})
    backend = ScriptedBackend(
        lambda q: always_wrong(q) if q.qtype.name == "score" else overconfident(q)
    )
    result = await calibrated_temperatures(backend, settings(tmp_path, source), MODEL)
    assert (
        result.server.source == "calibrated"
        and result.for_type("score") == result.server
    )
    assert result.for_type("choice").scope == "choice"
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert warning.getMessage() == (
        "decision calibration (score): the fitted T=20.000 is at the edge of [0.05, 20], server-wide T applies"
    )
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    score = json.loads(saved.read_text())["by_type"]["score"]
    assert (
        score["temperature"] == 20.0
        and score["used"] == 60
        and "edge" in score["fallback"]
    )


async def test_a_saved_single_temperature_result_is_not_reused(tmp_path):
    source = write_questions(tmp_path / "q.jsonl", 120)
    backend = ScriptedBackend(overconfident)
    first = await calibrated_temperatures(backend, settings(tmp_path, source), MODEL)
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    record = json.loads(saved.read_text())
    saved.unlink()
    old_key = {k: v for k, v in record.pop("key").items() if k != "scheme"}
    deployment_lock.save(
        tmp_path / "saved", old_key, {k: v for k, v in record.items() if k != "by_type"}
    )
    reads = []
    backend.score = lambda q: reads.append(q) or overconfident(q)
    assert (
        await calibrated_temperatures(backend, settings(tmp_path, source), MODEL)
        == first
        and len(reads) == 120
    )


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "can't read"),
        ("{not json\n", "line 1"),
        (
            '{"state": "s", "question": {"type": "noul"}, "expected": "maybe"}\n',
            "yes/no",
        ),
        (
            '{"state": "s", "question": {"type": "ranking"}, "expected": 0}\n',
            "unknown question type",
        ),
        (
            '{"state": "s", "question": {"type": "noul"}, "expected": "yes", "precision": 1}\n',
            "line 1: precision must be a number between 0 and 1, got 1",
        ),
        (
            '{"state": "s", "question": {"type": "noul"}, "expected": "no", "precision": true}\n',
            "precision must be a number between 0 and 1, got True",
        ),
        (
            (
                '{"state": "s", "question": {"type": "noul"}, "expected": "no", "precision": 0.9}\n'
                '{"state": "t", "question": {"type": "noul"}, "expected": "yes"}\n'
                '{"state": "u", "question": {"type": "noul"}, "expected": "no", "precision": 0.8}\n'
            ),
            "line 3: precision 0.8 for a question line 1 asks 0.9 of",
        ),
    ],
)
async def test_bad_files_give_the_default_with_a_warning(
    tmp_path, caplog, content, needle
):
    path = tmp_path / "q.jsonl"
    path.write_text(content or "")
    # a file that does not exist is refused here, at startup
    configured = settings(tmp_path, path)
    if content is None:
        path.unlink()  # there when the server started, gone when calibration reads it
    result = await calibrated_temperatures(
        ScriptedBackend(overconfident), configured, MODEL
    )
    assert result.server == Temperature(1.0, "default", "server") and not result.by_type
    assert needle in caplog.text


async def test_too_few_answered_questions_give_the_default(
    tmp_path, caplog, monkeypatch
):
    source = write_questions(tmp_path / "q.jsonl", 60)
    refusing = ScriptedBackend(lambda q: None if expected_of(q) else overconfident(q))
    result = await calibrated_temperatures(refusing, settings(tmp_path, source), MODEL)
    assert (
        result.server.source == "default"
        and "only 20 of 60 questions were answered" in caplog.text
    )
    # a fault may have refused those reads: a restart measures again, and fits
    monkeypatch.setattr(deployment_lock, "_RUN", "a-restart")
    again = await calibrated_temperatures(
        ScriptedBackend(overconfident), settings(tmp_path, source), MODEL
    )
    assert again.server.source == "calibrated"


async def test_an_edge_temperature_is_a_lasting_failure(tmp_path, caplog, monkeypatch):
    source = write_questions(tmp_path / "q.jsonl", 120)
    always_wrong = ScriptedBackend(
        lambda q: [0.0 if i == expected_of(q) else 9.0 for i in range(3)]
    )
    result = await calibrated_temperatures(
        always_wrong, settings(tmp_path, source), MODEL
    )
    assert (
        result.server.source == "default"
        and not result.by_type
        and "edge" in caplog.text
    )
    # the model's scores put T there, and would again: a restart reads nothing and says why
    monkeypatch.setattr(deployment_lock, "_RUN", "a-restart")
    caplog.clear()
    reads = []
    counting = ScriptedBackend(lambda q: reads.append(q) or overconfident(q))
    again = await calibrated_temperatures(counting, settings(tmp_path, source), MODEL)
    assert again.server == Temperature(1.0, "default", "server") and not reads
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    assert re.search(
        r"decision calibration: the saved result for this deployment is a failure, "
        r"T=1\.0 \(default\): the fitted T=20\.000 is at the edge of \[0\.05, 20\].*; "
        rf"delete {re.escape(str(saved))} to measure again",
        caplog.text,
    ), caplog.text
    # deleting it measures again
    saved.unlink()
    fresh = await calibrated_temperatures(counting, settings(tmp_path, source), MODEL)
    assert fresh.server.source == "calibrated" and reads


def test_the_bundled_set_loads_and_maps_answers():
    questions = question_file.load(question_file.BUNDLED)
    assert len(questions.questions) >= 240
    for item in questions.questions:
        assert 0 <= item.correct < len(item.question.options)


def test_a_saved_result_is_ignored_for_another_key(tmp_path):
    deployment_lock.save(tmp_path, {"a": 1}, {"temperature": 2.0})
    assert deployment_lock.load(tmp_path, {"a": 1})["temperature"] == 2.0
    assert deployment_lock.load(tmp_path, {"a": 2}) is None
    deployment_lock.path_for(tmp_path, {"a": 1}).write_text("{broken")
    assert deployment_lock.load(tmp_path, {"a": 1}) is None


async def test_configured_temperature_skips_calibration(tmp_path):
    backend = ScriptedBackend(overconfident)
    env = {
        "VLLM_TYPED_DECISIONS_TEMPERATURE": "2.5",
        "VLLM_TYPED_DECISIONS_CALIBRATION": "on",
    }
    service = DecisionService(Settings.from_env(env), backend, "m")

    async def calibrate():
        raise AssertionError(
            "calibration must not run when a temperature is configured"
        )

    await service.start(calibrate)
    assert service.temperatures.server == Temperature(2.5, "configured", "server")
    assert math.isclose(service.temperatures.for_type("choice").value, 2.5)


def test_the_offline_fitting_tool_matches_the_server_maths(tmp_path):
    from tools.quality.fit_temperature import fit
    from vllm.entrypoints.generate.decisions.calibration.maths import (
        Labelled,
        calibrate,
    )

    rng = random.Random(1)
    rows = [
        {
            "scores": [rng.gauss(0, 3) for _ in range(3)],
            "correct": rng.randrange(3),
            "group": f"g{i % 30}",
        }
        for i in range(150)
    ]
    captured = tmp_path / "captured.jsonl"
    captured.write_text("".join(json.dumps(r) + "\n" for r in rows))
    direct = calibrate(
        Labelled(
            [r["scores"] for r in rows],
            [r["correct"] for r in rows],
            [r["group"] for r in rows],
        )
    )
    assert fit(str(captured)) == direct


async def test_an_unwritable_folder_keeps_the_fit_and_warns(tmp_path, caplog):
    source = write_questions(tmp_path / "q.jsonl", 120)
    not_a_folder = tmp_path / "saved"
    not_a_folder.write_text("a file where the folder should be")
    result = await calibrated_temperatures(
        ScriptedBackend(overconfident), settings(tmp_path, source), MODEL
    )
    # measured and applied, not saved
    assert result.server.source == "calibrated" and result.server.value > 2
    assert (
        "decision calibration not saved (VLLM_TYPED_DECISIONS_CALIBRATION_DIR="
        in caplog.text
    )


def broken(record):
    return '{"applied_temperature": "NaN", "key": '


def malformed(record):
    """Whole JSON for the right key, but a type's T is not a temperature."""
    record["by_type"]["score"]["applied_temperature"] = "NaN"
    return json.dumps(record)


def denormal(record):
    """A T that validates as positive and finite, but scores divided by it overflow."""
    record["applied_temperature"] = 5e-324
    return json.dumps(record)


def type_huge(record):
    record["by_type"]["score"]["applied_temperature"] = 1e300
    return json.dumps(record)


@pytest.mark.parametrize("damage", [broken, malformed, denormal, type_huge])
async def test_a_corrupt_saved_result_is_measured_again(tmp_path, caplog, damage):
    source = write_questions(tmp_path / "q.jsonl", 120)
    backend = ScriptedBackend(overconfident)
    first = await calibrated_temperatures(backend, settings(tmp_path, source), MODEL)
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    saved.write_text(damage(json.loads(saved.read_text())))
    reads = []
    backend.score = lambda q: reads.append(q) or overconfident(q)
    again = await calibrated_temperatures(backend, settings(tmp_path, source), MODEL)
    # not trusted: measured again, same answer
    assert again == first and len(reads) == 120
    # and saved whole again
    assert json.loads(saved.read_text())["applied_temperature"] == first.server.value
    if damage in (denormal, type_huge):
        assert (
            "the saved result is not reused" in caplog.text
            and "VLLM_TYPED_DECISIONS_MAX_TEMPERATURE" in caplog.text
        )


async def test_a_fit_outside_the_servers_range_is_not_applied(tmp_path, caplog):
    source = write_questions(tmp_path / "q.jsonl", 120)
    narrow = Settings.from_env(
        {
            "VLLM_TYPED_DECISIONS_CALIBRATION": str(source),
            "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(tmp_path / "saved"),
            "VLLM_TYPED_DECISIONS_PRIOR": "off",
            "VLLM_TYPED_DECISIONS_MAX_TEMPERATURE": "1.5",
        }
    )
    result = await calibrated_temperatures(
        ScriptedBackend(overconfident), narrow, MODEL
    )
    assert result.server == Temperature(1.0, "default", "server") and not result.by_type
    assert (
        "decision calibration not applied, T=1.0 (default): its server-wide T="
        in caplog.text
    )


async def test_calibration_reads_as_requests_do_and_keys_the_debias_setting(tmp_path):
    """With VLLM_TYPED_DECISIONS_DEBIAS=rotate, calibration reads each question both ways (as a request
    would), and its saved result is not reused by a server that reads differently."""
    source = write_questions(tmp_path / "q.jsonl", 120)
    reads = []
    backend = ScriptedBackend(lambda q: reads.append(q) or overconfident(q))
    rotating = Settings.from_env(
        {
            "VLLM_TYPED_DECISIONS_CALIBRATION": str(source),
            "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(tmp_path / "saved"),
            "VLLM_TYPED_DECISIONS_DEBIAS": "rotate",
            "VLLM_TYPED_DECISIONS_PRIOR": "off",
        }
    )
    await startup_calibration(backend, rotating, MODEL)
    assert len(reads) == 240, "a score question is read forwards and reversed"
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    assert json.loads(saved.read_text())["key"]["debias"] == "rotate"
    await startup_calibration(backend, settings(tmp_path, source), MODEL)
    assert (
        len(reads) == 360
        and len(list((tmp_path / "saved").glob("calibration-*.json"))) == 2
    )
