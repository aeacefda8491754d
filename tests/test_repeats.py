"""Repeats: `repeats: N` in a grid file (or --repeats N) trains each point N times, interleaved, each
repeat its own child run with a `repeat` param; repeat 1 keeps the run key a point had before
repeats existed, so raising N trains only the missing repeats and lowering it trains nothing.
`repeats: auto` trains two rounds, then one more at a time until the speedups are clear or
max_repeats, and says which stopped it."""

from __future__ import annotations

import time
from pathlib import Path

import mlflow

from conftest import children, invoke, runs_of
from pipeline.analysis import rounds
from pipeline.base import names
from pipeline.measures import stats
from pipeline.present import sentences
from pipeline.settings.config import GridSpec, RunConfig, load_grid
from pipeline.settings.grid import config_hash, expand, run_count
from pipeline.sweep.runner import run_key

GRID = "experiment: reps\nrepeats: 2\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n"


def test_repeats_interleave_and_name_their_runs(write_grid):
    spec = load_grid(write_grid(GRID))
    points = expand(spec)
    assert [(p.index, p.config.batch_size, p.repeat) for p in points] == [
        (1, 128, 1),
        (2, 256, 1),
        (3, 128, 2),
        (4, 256, 2),
    ]
    assert [p.name for p in points] == ["cpu bs128 r1", "cpu bs256 r1", "cpu bs128 r2", "cpu bs256 r2"]
    assert run_count(spec) == 4
    single = expand(load_grid(write_grid(GRID.replace("repeats: 2\n", ""), "one.yaml")))
    assert [(p.name, p.repeat) for p in single] == [("cpu bs128", 1), ("cpu bs256", 1)]


def test_repeat_one_keeps_the_run_key_of_a_grid_without_repeats():
    config, identity = RunConfig(batch_size=64, device="cpu"), {"source": "x", "train_size": 512, "test_size": 256}
    plain = run_key(config, identity, "AMD EPYC")
    assert run_key(config, identity, "AMD EPYC", repeat=1) == plain
    assert plain == config_hash(config, **identity, host=__import__("socket").gethostname(), hardware="AMD EPYC")
    assert (
        len({plain, run_key(config, identity, "AMD EPYC", repeat=2), run_key(config, identity, "AMD EPYC", repeat=3)})
        == 3
    )


def test_validate_and_dry_run_count_runs_without_expanding(write_grid, data_dir):
    huge = write_grid(
        "repeats: 3\ngrid:\n  seed: [" + ", ".join(str(i) for i in range(1000)) + "]\n"
        "  batch_size: [" + ", ".join(str(i) for i in range(1, 1001)) + "]\n  device: [cpu]\n"
    )
    started = time.monotonic()
    out = invoke("validate", str(huge))
    assert out.exit_code == 0 and "ok: 1000000 grid points x 3 repeats = 3000000 runs" in _words(out), out.output
    out = invoke("run", str(huge), "--dry-run", "--data-dir", str(data_dir))
    assert out.exit_code == 0 and "1000000 grid points x 3 repeats = 3000000 runs (dry run" in _words(out), out.output
    assert time.monotonic() - started < 30
    small = write_grid(GRID, "small.yaml")
    out = invoke("run", str(small), "--max-points", "3", "--data-dir", str(data_dir))
    assert out.exit_code == 2 and "4 runs (2 grid points x 2 repeats) is more than --max-points 3" in _words(out)
    out = invoke("run", str(small), "--repeats", "0", "--data-dir", str(data_dir))
    assert out.exit_code == 2 and "'--repeats': got '0'; expected a positive integer" in _words(out), out.output


def _words(out) -> str:
    """The output with rich's line wrapping undone."""
    return " ".join(out.output.split())


def _by_start(uri: str, experiment: str = "reps") -> list:
    return sorted(children(runs_of(uri, experiment)), key=lambda r: (r.info.start_time, r.info.run_id))


def test_raising_repeats_trains_only_the_missing_ones(write_grid, data_dir, tracking_uri):
    """Two points x two repeats train in interleaved order (read back from the store's start times);
    --repeats 3 then trains the two third repeats only, --repeats 1 nothing."""
    args = ["run", str(write_grid(GRID)), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri]
    out = invoke(*args, "--dry-run")
    assert out.exit_code == 0 and "repeat" in out.output, out.output
    out = invoke(*args)
    assert out.exit_code == 0, out.output
    runs = _by_start(tracking_uri)
    assert [(r.data.params["batch_size"], r.data.params[names.REPEAT]) for r in runs] == [
        ("128", "1"),
        ("256", "1"),
        ("128", "2"),
        ("256", "2"),
    ]
    assert [r.info.run_name for r in runs] == ["cpu bs128 r1", "cpu bs256 r1", "cpu bs128 r2", "cpu bs256 r2"]
    assert len({r.data.tags[names.TAG_RUN_KEY] for r in runs}) == 4
    results = out.output[out.output.index("Results") :]
    assert "repeat" in results.splitlines()[2]  # the summary's header shows the repeat column

    out = invoke(*args, "--repeats", "3")
    assert out.exit_code == 0 and out.output.count("│ DONE") == 4, out.output
    runs = _by_start(tracking_uri)
    assert len(runs) == 6
    third = [(r.data.params["batch_size"], r.data.params[names.REPEAT]) for r in runs[4:]]
    assert third == [("128", "3"), ("256", "3")]
    parent = mlflow.MlflowClient(tracking_uri).get_run(runs[4].data.tags["mlflow.parentRunId"])
    assert parent.data.tags[names.TAG_OPTIONS] == "--repeats 3"

    out = invoke(*args, "--repeats", "1")
    assert out.exit_code == 0 and out.output.count("│ DONE") == 2, out.output
    assert len(children(runs_of(tracking_uri, "reps"))) == 6
    parent_ids = {r.data.tags["mlflow.parentRunId"] for r in runs}
    assert all(mlflow.MlflowClient(tracking_uri).get_run(p).info.status == "FINISHED" for p in parent_ids)


# --- repeats: auto ----------------------------------------------------------------------------------

AUTO_DATA = "data: {train_size: 128, test_size: 64}\n"


def test_auto_judges_each_varying_key_against_its_reference(tracking_uri):
    """Every key the grid varies is an axis, against cpu (when listed) or its first value; the device's
    reference is the one the runs used ("cuda:0" for the grid's "cuda"). A clear 2x is significant."""
    import numpy as np

    from pipeline.analysis.compare import build
    from pipeline.tracking.records import read_sweep
    from synthetic_sweeps import Run, jittered, write_sweep

    assert rounds.references(
        [("device", ("cuda", "cpu")), ("lr", (0.1,)), ("batch_size", (256, 64)), ("gpus_per_run", (1.0, 0.5))]
    ) == [("device", "cpu"), ("batch_size", 256)]
    assert rounds.references([("device", ("mps", "cuda"))]) == [("device", "mps")]
    rng = np.random.default_rng(7)
    runs = [
        Run(jittered(seconds, 4, rng), device=device)
        for _ in range(4)
        for device, seconds in (("cpu", 1.0), ("cuda:0", 0.5))
    ]
    parent = write_sweep(tracking_uri, "judged", runs)
    comparison = build(read_sweep(mlflow.MlflowClient(tracking_uri), parent_run_id=parent))
    spec = GridSpec(Path("g.yaml"), "judged", repeats=2, max_repeats=8)
    judged = rounds.judge(comparison, [("device", ("cuda", "cpu"))])
    assert [(s.label, s.clear) for s in judged.speedups] == [("cuda:0 vs cpu", True)]
    said = sentences.stop_reason(judged, 2, spec)
    assert said.startswith("every speedup is significant (cuda:0 vs cpu: ") and "x faster [" in said, said
    # The grid's reference ran nowhere (its points skipped, say): nothing on that axis to judge.
    no_mps = rounds.judge(comparison, [("device", ("mps", "cuda"))])
    assert no_mps.speedups == () and no_mps.why_none == "no speedup to judge: no run finished beside its twin on device"


def test_auto_stops_when_every_speedup_is_clear_or_at_the_cap():
    spec = GridSpec(Path("g.yaml"), "g", repeats=2, max_repeats=4, half_width=0.05)
    significant = rounds.Speedup("cuda:0 vs cpu", stats.Ratio(2.0, 1.9, 2.1, (4, 4)), spec.half_width)
    narrow = rounds.Speedup("cpu bs256 vs bs64", stats.Ratio(1.01, 0.98, 1.04, (4, 4)), spec.half_width)  # n.s., ±3%
    wide = rounds.Speedup("cpu bs128 vs bs64", stats.Ratio(1.1, 0.9, 1.3, (4, 4)), spec.half_width)  # n.s., ±18%
    # one run a side: no interval
    alone = rounds.Speedup("cpu bs512 vs bs64", stats.Ratio(1.5, runs=(1, 1)), spec.half_width)
    assert [s.clear for s in (significant, narrow, wide, alone)] == [True, True, False, False]
    assert sentences.stop_reason(rounds.Judgement((significant,)), 2, spec) == (
        "every speedup is significant (cuda:0 vs cpu: 2.00x faster [1.90-2.10] ±5.0%)"
    )
    assert sentences.stop_reason(rounds.Judgement((significant, narrow)), 3, spec).startswith(
        "every speedup is significant or within ±5% (cuda:0 vs cpu"
    )
    unclear = rounds.Judgement((significant, wide, alone))
    assert [rounds.decide(unclear, n, spec) for n in (3, 4)] == [rounds.CONTINUE, rounds.MAX_REPEATS]
    assert rounds.decide(rounds.Judgement((significant, narrow)), 2, spec) == rounds.ALL_CLEAR
    assert sentences.stop_reason(unclear, 3, spec) == ""
    assert sentences.round_progress(unclear, 3, spec) == (
        "repeats: auto, round 3 of at most 4: 2 speedups still unclear: cpu bs128 vs bs64: 1.10x faster "
        "[0.90-1.30] (n.s.) ±18.2%; cpu bs512 vs bs64: 1.50x faster (n too small (1 run)); training round 4"
    )
    assert sentences.rounds_stopped(4, sentences.stop_reason(unclear, 4, spec)).startswith(
        "repeats: auto stopped after 4 rounds: max_repeats 4 reached; no difference found in 2 speedups: "
        "cpu bs128 vs bs64: 1.10x faster [0.90-1.30] (n.s.)"
    )
    # Settled without a difference (the design's futility rule): clear, and said so.
    settled = rounds.Speedup("cpu seed1 vs seed0", stats.Ratio(1.01, 0.95, 1.07, (3, 3)), None, no_difference=True)
    assert settled.clear
    plain = GridSpec(Path("g.yaml"), "g", repeats=2, max_repeats=8)
    assert sentences.stop_reason(rounds.Judgement((significant, settled)), 3, plain) == (
        "every speedup is settled (cuda:0 vs cpu: 2.00x faster [1.90-2.10] ±5.0%; cpu seed1 vs seed0: no difference "
        "found within 3 runs a side, 1.01x faster [0.95-1.07] (n.s.))"
    )
    assert (
        sentences.stop_reason(rounds.Judgement(why_none="the grid varies no setting: nothing to compare"), 2, spec)
        == "the grid varies no setting: nothing to compare"
    )


def _parent_of(uri: str, experiment: str):
    client = mlflow.MlflowClient(uri)
    (parent,) = [r for r in runs_of(uri, experiment) if "mlflow.parentRunId" not in r.data.tags]
    return client.get_run(parent.info.run_id)


def test_auto_on_a_one_point_grid_stops_after_two_rounds(write_grid, data_dir, tracking_uri):
    """`--repeats auto` on a grid without repeats: two rounds, then nothing to compare, said at the end
    and recorded on the parent."""
    grid = write_grid("experiment: auto1\n" + AUTO_DATA + "grid:\n  batch_size: [64]\n  device: [cpu]\n  epochs: [1]\n")
    args = ["run", str(grid), "--repeats", "auto", "--data-dir", str(data_dir), "--tracking-uri", tracking_uri]
    out = invoke(*args, "--dry-run")
    assert out.exit_code == 0, out.output
    assert "1 grid point x 2 to 8 repeats (auto) = up to 8 runs (dry run" in _words(out)
    assert "the grid varies no setting, so there is nothing to compare and it stops there" in _words(out)
    out = invoke(*args)
    stopped = "repeats: auto stopped after 2 rounds: the grid varies no setting: nothing to compare"
    assert out.exit_code == 0 and stopped in _words(out), out.output
    assert [r.info.run_name for r in _by_start(tracking_uri, "auto1")] == ["cpu bs64 ep1 r1", "cpu bs64 ep1 r2"]
    parent = _parent_of(tracking_uri, "auto1")
    assert parent.data.tags[names.TAG_REPEATS_STOPPED] == stopped
    assert parent.data.metrics[names.ROUNDS] == 2
    assert (parent.data.params["repeats"], parent.data.params["max_repeats"]) == ("auto", "8")
    assert parent.data.tags[names.TAG_OPTIONS] == "--repeats auto"


def test_auto_trains_a_round_at_a_time_up_to_max_repeats(write_grid, data_dir, tracking_uri, monkeypatch):
    """A speedup that stays unclear (its interval pinned wide, whatever the method) gets one more round
    at a time, a line each, until max_repeats; a rerun reaches the same rounds and trains nothing."""
    # rounds.judge's own name for it: patching compare's would miss it once rounds is imported
    measured = rounds.axis_ratios
    monkeypatch.setattr(
        rounds,
        "axis_ratios",
        lambda *args: [(label, stats.Ratio(ratio.estimate, 0.5, 2.0, ratio.runs)) for label, ratio in measured(*args)],
    )
    grid = write_grid(
        "experiment: auto3\nrepeats: auto\nmax_repeats: 3\n"
        + AUTO_DATA
        + "grid:\n  batch_size: [64, 128]\n  device: [cpu]\n  epochs: [1]\n"
    )
    args = ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri]
    out = invoke(*args)
    assert out.exit_code == 0, out.output
    words = _words(out)
    assert "repeats: auto, round 2 of at most 3: 1 speedup still unclear: cpu bs128 vs bs64: " in words
    assert "training round 3" in words
    stopped = (
        "repeats: auto stopped after 3 rounds: max_repeats 3 reached; no difference found in 1 speedup: "
        "cpu bs128 vs bs64"
    )
    assert stopped in words
    runs = _by_start(tracking_uri, "auto3")
    assert [(r.data.params["batch_size"], r.data.params[names.REPEAT]) for r in runs] == [
        ("64", "1"),
        ("128", "1"),
        ("64", "2"),
        ("128", "2"),
        ("64", "3"),
        ("128", "3"),
    ]
    assert runs[-1].info.run_name == "cpu bs128 r3"
    parent = _parent_of(tracking_uri, "auto3")
    assert parent.data.tags[names.TAG_REPEATS_STOPPED].startswith(stopped)
    assert parent.data.metrics[names.ROUNDS] == 3

    out = invoke(*args)
    assert out.exit_code == 0 and out.output.count("│ DONE") == 6 and stopped in _words(out), out.output
    assert len(children(runs_of(tracking_uri, "auto3"))) == 6


def test_an_equal_pair_is_settled_as_no_difference_at_the_designs_confidence(tracking_uri):
    """A `repeats: auto` sweep (max_repeats 8) read back after round 3: its comparison takes the round
    from the parent's `rounds` and judges at the sequential design's confidence for it, wider than a
    plain 95%. Two seeds that time alike are settled as no difference found (the futility rule);
    a clear 2x device speedup in the same sweep is significant; `pipeline compare` says at which
    confidence its intervals are."""
    from pipeline.measures.sequential import Design
    from pipeline.sweep.comparing import comparison_of
    from synthetic_sweeps import Run, write_sweep

    times = {"0": [1.000, 1.012, 0.991], "1": [1.004, 0.995, 1.008]}
    runs = [
        Run([2 * t, t, t], device, {"seed": seed, names.REPEAT: str(r)})
        for r in (1, 2, 3)
        for seed in ("0", "1")
        for device, t in (("cpu", times[seed][r - 1]), ("cuda:0", times[seed][r - 1] / 2))
    ]
    parent = write_sweep(tracking_uri, "settled", runs)
    client = mlflow.MlflowClient(tracking_uri)
    client.log_param(parent, "repeats", "auto")
    client.log_param(parent, "max_repeats", "8")
    client.log_metric(parent, names.ROUNDS, 3)
    comparison = comparison_of(client, parent_run=parent)
    assert comparison.rounds == (3, 8) and comparison.confidence == Design(8).confidence(3) > 0.98
    judged = rounds.judge(comparison, [("device", ("cuda", "cpu")), ("seed", (0, 1))])
    devices = [s for s in judged.speedups if s.label.endswith(" vs cpu")]
    seeds = [s for s in judged.speedups if s.label.endswith("seed1 vs seed0")]
    assert len(devices) == 2 and all(s.ratio.significant and not s.no_difference for s in devices)
    assert len(seeds) == 2 and all(s.no_difference and s.ratio.significant is False for s in seeds)
    spec = GridSpec(Path("g.yaml"), "settled", repeats=2, max_repeats=8)
    assert rounds.decide(judged, 3, spec) == rounds.ALL_CLEAR
    said = sentences.stop_reason(judged, 3, spec)
    assert said.startswith("every speedup is settled (") and "no difference found within 3 runs a side" in said
    out = invoke("compare", "--tracking-uri", tracking_uri, "--experiment", "settled")
    assert out.exit_code == 0, out.output
    confidence = f"{100 * Design(8).confidence(3):.1f}%"
    note = f"every interval is the sequential design's repeated 95% interval, {confidence} at this round"
    assert f"repeats: auto, round 3 of at most 8: {note}" in _words(out)
