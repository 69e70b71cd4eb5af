"""The one Finding type: preflight and monitoring report with it, and a malformed finding is refused."""

from __future__ import annotations

import pytest

from course_utils.core.findings import SEVERITIES, Finding
from course_utils.training import monitoring, preflight


def test_preflight_and_monitoring_share_the_type():
    assert preflight.Finding is Finding and monitoring.Finding is Finding


def test_str_names_severity_code_step_and_fix():
    text = str(Finding("warning", "clipped_high", "60% clipped.", "raise max_completion_length", step=7))
    assert text == "[warning] clipped_high at step 7: 60% clipped. Fix: raise max_completion_length"
    assert str(Finding("error", "x", "m.", "f")) == "[error] x: m. Fix: f"


@pytest.mark.parametrize(("severity", "code", "match"), [("fatal", "x", "severity"), ("info", "", "code")])
def test_bad_findings_are_refused(severity, code, match):
    with pytest.raises(ValueError, match=match):
        Finding(severity, code, "message", "fix")


def test_monitoring_findings_are_warnings_with_their_step():
    history = [{"step": s, "reward": 0.0, "completions/clipped_ratio": 0.9} for s in range(1, 6)]
    (finding,) = monitoring.monitor(history)
    assert (finding.severity, finding.code, finding.step) == ("warning", "clipped_high", 5)
    assert finding.severity in SEVERITIES
