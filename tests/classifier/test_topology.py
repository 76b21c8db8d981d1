"""TopologyDetector: one GPU or two, from requests that ran alone beside a busy batch."""

from __future__ import annotations

import pytest

from classifier.topology import TopologyDetector


def test_a_setting_is_taken_as_it_is() -> None:
    for setting in (True, False):
        detector = TopologyDetector(setting)
        assert detector.shared is setting and not detector.measuring
        assert not detector.probe_now()
    with pytest.raises(ValueError, match="auto"):
        TopologyDetector("yes")


@pytest.mark.parametrize(
    ("took", "shared"),
    [(2.0, True), (1.9, True), (0.75, False), (0.6, False)],
)
def test_five_clear_probes_decide(took: float, shared: bool) -> None:
    """alone 1 s, shared 2 s: taking 2 s is one GPU, taking 0.75 s is two."""
    detector = TopologyDetector("auto")
    for _ in range(4):
        send_probe(detector)
        detector.observe(took, 1.0, 2.0)
        assert detector.shared is None
    send_probe(detector)
    detector.observe(took, 1.0, 2.0)
    assert detector.shared is shared


def send_probe(detector: TopologyDetector) -> None:
    while not detector.probe_now():
        pass


def test_only_probes_count() -> None:
    """A request found alone beside a batch by chance (a drain's last) ran only part of
    its life there: it is not evidence."""
    detector = TopologyDetector("auto")
    for _ in range(5):
        detector.observe(2.0, 1.0, 2.0)
    assert detector.evidence() is None


def test_unclear_probes_decide_by_the_sign_after_nine() -> None:
    detector = TopologyDetector("auto")
    for took in (1.1, 0.95, 1.05, 1.1, 0.97, 1.08, 1.02, 1.06):  # |median f| < 0.3
        send_probe(detector)
        detector.observe(took, 1.0, 2.0)
        assert detector.shared is None
    send_probe(detector)
    detector.observe(1.1, 1.0, 2.0)
    assert detector.shared is True  # slower than alone, more often than not


def test_indistinct_hypotheses_teach_nothing() -> None:
    detector = TopologyDetector("auto")
    for _ in range(20):
        send_probe(detector)
        detector.observe(1.2, 1.0, 1.1)  # the other's steps are too small to tell
    assert detector.shared is None and detector.evidence() is None


def test_probes_are_spaced_and_stop_with_a_verdict() -> None:
    detector = TopologyDetector("auto")
    fired = [detector.probe_now() for _ in range(200)]
    assert sum(fired) == 8 and fired.index(True) == 24
    for _ in range(5):
        detector.observe(2.0, 1.0, 2.0)  # the answers to five of the eight probes
    assert detector.shared is True
    assert not any(detector.probe_now() for _ in range(200))
