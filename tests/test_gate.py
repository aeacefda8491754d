"""The regression gate (`pipeline compare --baseline`): each point FASTER, SLOWER, NO CHANGE or
INCONCLUSIVE with its reason, and the exit code that says it, on synthetic sweeps whose epoch times
the tests set."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import new_store
from pipeline.base import names
from pipeline.cli import main
from synthetic_sweeps import Run, jittered, write_sweep


def _sweep(uri, experiment, seconds, seed, **run):
    """Two settings (batch sizes), 4 repeats each, at `seconds` and 0.8 x `seconds` per epoch."""
    rng = np.random.default_rng(seed)
    return write_sweep(
        uri,
        experiment,
        [
            Run(jittered(base, 4, rng), params={"batch_size": bs, names.REPEAT: str(r)}, **run)
            for bs, base in (("128", seconds), ("256", 0.8 * seconds))
            for r in range(1, 5)
        ],
    )


@pytest.fixture(scope="module")
def slower(tmp_path_factory, _store_template):
    """A baseline sweep, then one 30% slower at every point; one store per module (tests only read it)."""
    tracking_uri = new_store(tmp_path_factory.mktemp("gate"), _store_template)
    baseline = _sweep(tracking_uri, "base", 1.0, seed=1)
    current = _sweep(tracking_uri, "now", 1.3, seed=2)
    return tracking_uri, baseline, current


def _gate(uri, *args):
    return CliRunner().invoke(main, ["compare", "--tracking-uri", uri, *args])


def test_a_30_percent_slowdown_fails_a_10_percent_gate_and_passes_a_50_percent_one(slower):
    uri, baseline, current = slower
    out = _gate(uri, "--parent-run", current, "--baseline", baseline, "--fail-if-slower", "10")
    assert out.exit_code == 1, out.output
    assert len(re.findall(r"\+(2\d|3\d)\.\d% slower \[\+\d+\.\d%, \+\d+\.\d%\]", out.output)) == 2, out.output
    assert "FAIL: 2 of 2 judged points slower by more than 10%" in out.output
    assert out.output.count("SLOWER") == 2
    out = _gate(uri, "--parent-run", current, "--baseline", baseline, "--fail-if-slower", "50")
    assert out.exit_code == 0 and "PASS: none of the 2 points is slower by more than 50%" in out.output, out.output
    out = _gate(uri, "--parent-run", current, "--baseline", baseline)  # report only
    assert out.exit_code == 0 and "does not fail" in out.output


def test_the_same_timings_again_do_not_fail(tracking_uri):
    """An A/A gate: a sweep against a sweep of the same distribution passes even at 0%: every
    interval includes no change."""
    baseline = _sweep(tracking_uri, "base", 1.0, seed=3)
    current = _sweep(tracking_uri, "now", 1.0, seed=4)
    out = _gate(
        tracking_uri, "--parent-run", current, "--baseline", baseline, "--fail-if-slower", "0", "--format", "json"
    )
    assert out.exit_code == 0, out.output
    points = json.loads(out.stdout)["points"]
    assert len(points) == 2 and all(p["change_pct_low"] < 0 < p["change_pct_high"] for p in points)
    assert not any(p["significant"] for p in points)


def test_markdown_fits_a_ci_comment(slower):
    uri, baseline, current = slower
    out = _gate(uri, "--parent-run", current, "--baseline", "base", "--fail-if-slower", "10", "--format", "markdown")
    lines = out.stdout.strip().splitlines()
    assert out.exit_code == 1
    assert lines[0].startswith("### Epoch time of now-sweep against the baseline base-sweep")
    assert lines[2].startswith("| point |") and len([line for line in lines if line.startswith("| cpu")]) == 2
    assert lines[-1].startswith("**FAIL: 2 of 2 judged points") and len(lines) == 8  # heading, table, verdict


def test_a_baseline_from_other_hardware_is_refused(tracking_uri):
    baseline = _sweep(tracking_uri, "base", 1.0, seed=5, hardware="AMD EPYC 7B13")
    current = _sweep(tracking_uri, "now", 1.0, seed=6, hardware="Intel Xeon 8481C")
    out = _gate(tracking_uri, "--parent-run", current, "--baseline", baseline, "--fail-if-slower", "10")
    assert out.exit_code == 2, out.output
    assert "AMD EPYC 7B13" in out.output and "Intel Xeon 8481C" in out.output and "refused" in out.output
    assert len(out.output.strip().splitlines()) == 1


def test_hosts_must_match_unless_across_hosts(tracking_uri):
    baseline = _sweep(tracking_uri, "base", 1.0, seed=7, host="ci-1")
    current = _sweep(tracking_uri, "now", 1.3, seed=8, host="ci-2")
    out = _gate(tracking_uri, "--parent-run", current, "--baseline", baseline)
    assert out.exit_code == 2 and "no point has the same settings" in out.output
    assert "on ci-2" in out.output and "on ci-1" in out.output and "--across-hosts" in out.output
    out = _gate(
        tracking_uri, "--parent-run", current, "--baseline", baseline, "--across-hosts", "--fail-if-slower", "10"
    )
    assert out.exit_code == 1, out.output


def test_points_without_a_baseline_twin_are_counted_and_none_at_all_is_refused(tracking_uri):
    """A gate with no pair says which point each side has (the first, in the verdict's order: bs256 is best)."""
    baseline = write_sweep(tracking_uri, "base", [Run([2.0, 1.0, 1.0], params={"batch_size": "64"})])
    current = _sweep(tracking_uri, "now", 1.0, seed=9)
    out = _gate(tracking_uri, "--parent-run", current, "--baseline", baseline)
    assert out.exit_code == 2, out.output
    assert "this sweep has cpu batch_size=256" in out.output and "the baseline has cpu batch_size=64" in out.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--fail-if-slower", "10"], "--fail-if-slower 10 needs --baseline"),
        (["--baseline", "base", "--fail-if-slower", "-5"], "--fail-if-slower -5: give a percentage >= 0"),
        (["--baseline", "nope"], "--baseline nope: no experiment 'nope'"),
        (["--allow-inconclusive"], "--allow-inconclusive needs --baseline SWEEP and --fail-if-slower PCT"),
        (["--baseline", "base", "--allow-inconclusive"], "--allow-inconclusive needs --baseline SWEEP"),
        (["--quality-margin", "1"], "--quality-margin 1: give a number >= 0 and below 1"),
        (["--quality-margin", "-0.1"], "--quality-margin -0.1: give a number >= 0 and below 1"),
    ],
)
def test_bad_gate_options_are_one_line_and_exit_2(slower, args, message):
    uri, _, current = slower
    out = _gate(uri, "--parent-run", current, *args)
    assert out.exit_code == 2 and message in out.output, out.output
    assert len(out.output.strip().splitlines()) == 1


def test_points_whose_runs_are_all_contended_are_inconclusive_and_count_with_include_contended(tracking_uri):
    baseline = _sweep(tracking_uri, "base", 1.0, seed=5)
    busy = {names.TAG_CONTENDED: "other processes took 60% of 2 cores; load average 2.1 per core"}
    current = _sweep(tracking_uri, "now", 2.0, seed=6, tags=busy)
    out = _gate(
        tracking_uri, "--parent-run", current, "--baseline", baseline, "--fail-if-slower", "10", "--format", "json"
    )
    assert out.exit_code == 3, out.output
    points = json.loads(out.stdout)["points"]
    assert [p["state"] for p in points] == ["INCONCLUSIVE"] * 2
    assert all(p["reason"] == "every run contended in this sweep (--include-contended counts them)" for p in points)
    out = _gate(
        tracking_uri, "--parent-run", current, "--baseline", baseline, "--fail-if-slower", "10", "--include-contended"
    )
    assert out.exit_code == 1 and "FAIL: 2 of 2 judged points" in out.output, out.output


def test_a_2x_slowdown_at_one_run_a_side_is_inconclusive_not_a_pass(tracking_uri):
    baseline = write_sweep(tracking_uri, "base", [Run([2.0, 1.0, 1.0])])
    current = write_sweep(tracking_uri, "now", [Run([4.0, 2.0, 2.0])])
    out = _gate(tracking_uri, "--parent-run", current, "--baseline", baseline, "--fail-if-slower", "10")
    assert out.exit_code == 3, out.output
    assert "INCONCLUSIVE" in out.output and "+100.0% slower (n too small (1 run))" in out.output
    assert "PASS" not in out.output
    out = _gate(
        tracking_uri, "--parent-run", current, "--baseline", baseline, "--fail-if-slower", "10", "--allow-inconclusive"
    )
    assert out.exit_code == 0 and "PASS (--allow-inconclusive)" in out.output, out.output


def test_a_point_only_one_side_has_is_named(tracking_uri):
    """The baseline has batch sizes 128 and 256; this sweep only 128: 256 is named, not passed over."""
    baseline = _sweep(tracking_uri, "base", 1.0, seed=10)
    rng = np.random.default_rng(11)
    current = write_sweep(
        tracking_uri,
        "now",
        [Run(jittered(1.0, 4, rng), params={"batch_size": "128", names.REPEAT: str(r)}) for r in range(1, 5)],
    )
    out = _gate(
        tracking_uri, "--parent-run", current, "--baseline", baseline, "--fail-if-slower", "10", "--format", "json"
    )
    assert out.exit_code == 3, out.output
    states = {p["point"]: (p["state"], p["reason"]) for p in json.loads(out.stdout)["points"]}
    assert states["cpu batch_size=256"] == ("INCONCLUSIVE", "only in the baseline")
    assert states["cpu batch_size=128"][0] in ("NO CHANGE", "FASTER")


def test_a_sweep_gated_against_itself_is_refused(slower):
    uri, _, current = slower
    out = _gate(uri, "--parent-run", current, "--baseline", current, "--fail-if-slower", "10")
    assert out.exit_code == 2 and "that is the sweep being compared" in out.output, out.output
    assert len(out.output.strip().splitlines()) == 1


def test_a_point_fails_only_when_its_interval_is_beyond_the_threshold(tracking_uri):
    """A point 12% slower on its estimate, but whose interval reaches below +10%: a 10% gate passes it
    (judging the estimate alone failed it); the same point fails a 5% gate. The verdict names the
    correction across the build's points."""

    def sweep(experiment, seconds):
        return write_sweep(
            tracking_uri,
            experiment,
            [
                Run([2 * t, t, t, t], params={"batch_size": bs, names.REPEAT: str(r)})
                for bs in ("128", "256")
                for r, t in enumerate(seconds, start=1)
            ],
        )

    baseline = sweep("steady", [1.0, 1.02, 0.98, 1.0])
    current = sweep("later", [1.12, 1.10, 1.145, 1.115])
    out = _gate(tracking_uri, "--parent-run", current, "--baseline", baseline, "--fail-if-slower", "10")
    assert out.exit_code == 0, out.output
    words = " ".join(out.output.split())
    assert "PASS: none of the 2 points is slower by more than 10% (2 NO CHANGE; Holm over 2 judged points" in words
    out = _gate(
        tracking_uri, "--parent-run", current, "--baseline", baseline, "--fail-if-slower", "5", "--format", "json"
    )
    assert out.exit_code == 1, out.output
    points = json.loads(out.stdout)["points"]
    assert all(p["state"] == "SLOWER" and p["change_pct_low"] > 5 and p["slower_p_holm"] <= 0.025 for p in points)


def test_holm_corrects_across_the_points_of_a_build():
    """Holm's step-down by hand: with three judged points the smallest p-value is held to 2.5% / 3,
    the next to 2.5% / 2; a point not judged (NaN) is not counted."""
    from pipeline.analysis import gate

    slower = np.array([[0.005, 0.011, 0.2, np.nan]])
    assert gate.holm(slower)[0][:3] == pytest.approx([0.015, 0.022, 0.2])
    states = gate.states(slower, np.full_like(slower, 0.9))[0]
    assert list(states) == ["SLOWER", "SLOWER", "NO CHANGE", "INCONCLUSIVE"]
    # Alone, 0.02 fails; beside a second point it would need 0.0125 or less.
    assert list(gate.states(np.array([[0.02]]), np.array([[0.9]]))[0]) == ["SLOWER"]
    assert list(gate.states(np.array([[0.02, 0.5]]), np.array([[0.9, 0.9]]))[0]) == ["NO CHANGE", "NO CHANGE"]
