"""Startup calibration around the maths: question files, saved results, failures, with a scripted backend."""

from __future__ import annotations

import json
import math
import random

import pytest

from vllm.entrypoints.generate.decisions.calibration import question_file, store
from vllm.entrypoints.generate.decisions.calibration.startup import startup_calibration
from vllm.entrypoints.generate.decisions.service import DecisionService
from vllm.entrypoints.generate.decisions.settings import Settings

from .fakes import ScriptedBackend

MODEL = {"model": "m", "model_path": "/m", "revision": None, "quantization": None, "dtype": "bfloat16"}


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
            f.write(json.dumps({"state": f"state {i}", "group": f"g{i % groups}", "id": f"q{i}", "expected": expected,
                                "question": {"type": "score", "instructions": f"level #{expected} (q{i})",
                                             "criteria": ["low", "mid", "high"]}}) + "\n")  # fmt: skip
    return path


def settings(tmp_path, source):
    return Settings.from_env({"VLLM_TYPED_DECISIONS_CALIBRATION": str(source),
                              "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(tmp_path / "saved")})  # fmt: skip


async def test_fits_saves_and_reuses(tmp_path, caplog):
    source = write_questions(tmp_path / "q.jsonl", 200)
    backend = ScriptedBackend(overconfident)
    first = await startup_calibration(backend, settings(tmp_path, source), MODEL)
    assert first.source == "calibrated" and first.value > 2
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    record = json.loads(saved.read_text())
    assert record["kept"] and record["questions"]["used"] == 200 and record["key"]["questions_sha256"]
    assert record["ece_calibrated_interval"][1] < record["ece_raw_interval"][0]

    reads = []
    backend.score = lambda q: reads.append(q) or overconfident(q)
    again = await startup_calibration(backend, settings(tmp_path, source), MODEL)
    assert again == first and reads == [], "a saved result for the same deployment is reused"

    write_questions(source, 199)  # a changed question file: a new key, a new calibration
    changed = await startup_calibration(backend, settings(tmp_path, source), MODEL)
    assert changed.source == "calibrated" and len(reads) == 199
    assert len(list((tmp_path / "saved").glob("calibration-*.json"))) == 2


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "can't read"),
        ("{not json\n", "line 1"),
        ('{"state": "s", "question": {"type": "noul"}, "expected": "maybe"}\n', "yes/no"),
        ('{"state": "s", "question": {"type": "ranking"}, "expected": 0}\n', "unknown question type"),
    ],
)
async def test_bad_files_give_the_default_with_a_warning(tmp_path, caplog, content, needle):
    path = tmp_path / "q.jsonl"
    if content is not None:
        path.write_text(content)
    result = await startup_calibration(ScriptedBackend(overconfident), settings(tmp_path, path), MODEL)
    assert (result.value, result.source) == (1.0, "default")
    assert needle in caplog.text


async def test_too_few_answered_questions_give_the_default(tmp_path, caplog):
    source = write_questions(tmp_path / "q.jsonl", 60)
    refusing = ScriptedBackend(lambda q: None if expected_of(q) else overconfident(q))
    result = await startup_calibration(refusing, settings(tmp_path, source), MODEL)
    assert result.source == "default" and "only 20 of 60 questions were answered" in caplog.text


async def test_an_edge_temperature_is_a_failure(tmp_path, caplog):
    source = write_questions(tmp_path / "q.jsonl", 120)
    always_wrong = ScriptedBackend(lambda q: [0.0 if i == expected_of(q) else 9.0 for i in range(3)])
    result = await startup_calibration(always_wrong, settings(tmp_path, source), MODEL)
    assert result.source == "default" and "edge" in caplog.text


def test_the_bundled_set_loads_and_maps_answers():
    questions = question_file.load(question_file.BUNDLED)
    assert len(questions.questions) >= 240
    for item in questions.questions:
        assert 0 <= item.correct < len(item.question.options)


def test_store_ignores_a_file_for_another_key(tmp_path):
    store.save(tmp_path, {"a": 1}, {"temperature": 2.0})
    assert store.load(tmp_path, {"a": 1})["temperature"] == 2.0
    assert store.load(tmp_path, {"a": 2}) is None
    store.path_for(tmp_path, {"a": 1}).write_text("{broken")
    assert store.load(tmp_path, {"a": 1}) is None


async def test_configured_temperature_skips_calibration(tmp_path):
    backend = ScriptedBackend(overconfident)
    env = {"VLLM_TYPED_DECISIONS_TEMPERATURE": "2.5", "VLLM_TYPED_DECISIONS_CALIBRATION": "on"}
    service = DecisionService(Settings.from_env(env), backend, "m")

    async def calibrate():
        raise AssertionError("calibration must not run when a temperature is configured")

    await service.start(calibrate)
    assert (service.temperature, service.temperature_source) == (2.5, "configured")
    assert math.isclose(service.temperature, 2.5)


def test_the_offline_fitting_tool_matches_the_server_maths(tmp_path):
    import sys

    from vllm.entrypoints.generate.decisions.calibration.maths import calibrate

    from ..conftest import ROOT

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from fit_temperature import fit
    finally:
        sys.path.remove(str(ROOT / "tools"))
    rng = random.Random(1)
    rows = [{"scores": [rng.gauss(0, 3) for _ in range(3)], "correct": rng.randrange(3), "group": f"g{i % 30}"}
            for i in range(150)]  # fmt: skip
    captured = tmp_path / "captured.jsonl"
    captured.write_text("".join(json.dumps(r) + "\n" for r in rows))
    direct = calibrate([r["scores"] for r in rows], [r["correct"] for r in rows], [r["group"] for r in rows])
    assert fit(str(captured)) == direct


async def test_an_unwritable_folder_keeps_the_fit_and_warns(tmp_path, caplog):
    source = write_questions(tmp_path / "q.jsonl", 120)
    not_a_folder = tmp_path / "saved"
    not_a_folder.write_text("a file where the folder should be")
    result = await startup_calibration(ScriptedBackend(overconfident), settings(tmp_path, source), MODEL)
    assert result.source == "calibrated" and result.value > 2  # measured and applied, just not saved
    assert "decision calibration not saved (VLLM_TYPED_DECISIONS_CALIBRATION_DIR=" in caplog.text


async def test_a_corrupt_saved_result_is_measured_again(tmp_path, caplog):
    source = write_questions(tmp_path / "q.jsonl", 120)
    backend = ScriptedBackend(overconfident)
    first = await startup_calibration(backend, settings(tmp_path, source), MODEL)
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    saved.write_text('{"applied_temperature": "NaN", "key": ')
    reads = []
    backend.score = lambda q: reads.append(q) or overconfident(q)
    again = await startup_calibration(backend, settings(tmp_path, source), MODEL)
    assert again == first and len(reads) == 120  # not trusted: measured again, same answer
    assert json.loads(saved.read_text())["applied_temperature"] == first.value  # and saved whole again
