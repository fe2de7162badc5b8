"""The committed calibration ran the hard cases as they are (conformance/numerics/hard_cases.json):
a case added to the file without a new calibration would leave its tolerance unset."""

import json

from conformance.commands.calibrate import HARD_CASES_FILE, hard_cases, hard_cases_digest
from conformance.numerics.tolerances import CALIBRATION


def stale(calibration: dict, path=HARD_CASES_FILE) -> str | None:
    recorded = calibration.get("hard_cases_sha256")
    if recorded != hard_cases_digest(path):
        return f"calibration.json ran hard cases {recorded!r:.20}, {path.name} is now another: recalibrate"
    return None


def test_the_committed_calibration_ran_every_hard_case():
    assert stale(json.loads(CALIBRATION.read_text())) is None


def test_a_hard_case_added_since_the_calibration_is_told(tmp_path):
    calibration = json.loads(CALIBRATION.read_text())
    grown = json.loads(HARD_CASES_FILE.read_text())
    grown["cases"].append(grown["cases"][0])
    path = tmp_path / "hard_cases.json"
    path.write_text(json.dumps(grown))
    assert "recalibrate" in stale(calibration, path)


def test_every_hard_case_builds_and_says_why():
    entries = json.loads(HARD_CASES_FILE.read_text())["cases"]
    assert len(hard_cases()) == len(entries) and all(e["why"] for e in entries)
