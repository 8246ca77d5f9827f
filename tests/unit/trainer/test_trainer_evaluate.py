"""qveil.trainer.evaluate's one-line summary of the returns (the last line of `qveil
evaluate`'s table, and of `make demo`)."""

from __future__ import annotations

from qveil.trainer.evaluate import PolicyScore, summary_line


def test_summary_line_names_each_policy_without_its_parenthesis() -> None:
    scores = [
        PolicyScore("served release (GetBestActions)", 20.677, 0.392, 0.039, 100),
        PolicyScore("random", 11.305, 2.991, 0.299, 100),
        PolicyScore("non-private FQI (the release's estimator, no noise)", 20.707, 0.4, 0.04, 100),
    ]
    assert summary_line(scores) == (
        "served release 20.7, random 11.3, non-private FQI 20.7 (mean return over 100 episodes)"
    )
    assert summary_line([PolicyScore("bare network", -3.04, 1.0, 0.1, 5)]) == (
        "bare network -3.0 (mean return over 5 episodes)"
    )
