"""Energy counters: read where the hardware tells, unwrapped, and absent (never zero) elsewhere."""

from __future__ import annotations

import pytest
import torch

from pipeline.training import energy


def _package(root, name, uj, max_uj=1000_000_000):
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(str(uj))
    (zone / "max_energy_range_uj").write_text(str(max_uj))
    (root / name / f"{name}:0").mkdir()  # a sub-zone (core): not counted twice
    return zone


def test_rapl_sums_packages_and_unwraps_the_counter(tmp_path, monkeypatch):
    a = _package(tmp_path, "intel-rapl:0", 999_000_000)
    b = _package(tmp_path, "intel-rapl:1", 5_000_000)
    monkeypatch.setattr(energy, "RAPL", tmp_path)
    meter = energy.EnergyMeter(torch.device("cpu"))
    assert meter.why_not == ""
    meter.start()
    (a / "energy_uj").write_text("2000000")  # wrapped past 1e9: +3 J
    (b / "energy_uj").write_text("9000000")  # +4 J
    assert meter.joules() == pytest.approx(7.0)


def test_no_counter_is_none_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(energy, "RAPL", tmp_path / "missing")
    meter = energy.EnergyMeter(torch.device("cpu"))
    meter.start()
    assert meter.joules() is None and "no RAPL energy counters" in meter.why_not
    assert energy.EnergyMeter(torch.device("meta")).joules() is None
