"""A device's GEMM row tiles (``Device.gemm_row_tiles``): a pass over several rows
computes as the rows its tiles cover, in the simulator and in calibration alike."""

from __future__ import annotations

import pytest

from analyses.calibrate.terms import Param, Terms, fit
from hwprofiles import load_model, load_platform
from simcore.costmodel import RooflineCost
from test_calibrate import CORES, _optional_runs, true_platform

TILED = load_platform("cpu-local")  # measured tiles of 4, 2 and 1 rows


def untiled(platform):
    devices = tuple(d.model_copy(update={"gemm_row_tiles": None}) for d in platform.devices)
    return platform.model_copy(update={"devices": devices})


@pytest.mark.parametrize("rows,computed", [
    (1, 1), (2, 4), (3, 8), (4, 4), (5, 8), (7, 12), (8, 8), (9, 12), (11, 16),
    (15, 20), (17, 20), (19, 24), (24, 24), (61, 64), (63, 68)])
def test_rows_are_covered_by_the_largest_tiles_first_each_computing_as_the_largest(
        rows, computed):
    device = TILED.device("cpu0")
    assert device.gemm_row_tiles == (4, 2, 1)
    assert device.compute_rows(rows) == computed
    assert device.compute_padding(rows) == computed / rows
    plain = untiled(TILED).device("cpu0")
    assert plain.compute_rows(rows) == rows and plain.compute_padding(rows) == 1.0


@pytest.mark.parametrize("tiles", [[], [4, 2], [2, 4, 1], [4, 4, 1], [0, 1], [2048, 1]])
def test_tiles_that_cannot_cover_every_width_are_refused(tiles):
    fields = TILED.device("cpu0").model_dump(exclude_unset=True)
    with pytest.raises(ValueError, match="gemm_row_tiles of device cpu0 .*largest first"):
        type(TILED.device("cpu0")).model_validate({**fields, "gemm_row_tiles": tiles})


def test_a_tiled_pass_pays_compute_on_its_padded_rows_and_nothing_else():
    """11 positions on 4/2/1 tiles compute as 16: the compute term is 16/11 of the
    untiled one; launch and memory terms are the same; one row is a GEMV."""
    spec = load_model("smollm2-135m")
    tiled, plain = RooflineCost(TILED), RooflineCost(untiled(TILED))
    for rows, pad in ((11, 16 / 11), (5, 8 / 5), (1, 1.0)):
        a = tiled.forward(spec, "cpu0", (0, 30), rows, 1, 200, "lm", None)
        b = plain.forward(spec, "cpu0", (0, 30), rows, 1, 200, "lm", None)
        assert a.compute_s == pytest.approx(b.compute_s * pad, rel=1e-12)
        assert (a.launch_s, a.memory_s, a.flops) == (b.launch_s, b.memory_s, b.flops)


def test_calibration_bills_compute_on_the_tiles_and_recovers_the_truth(tmp_path):
    """Runs measured on a device with tiles: fitted with the tiles, the fit recovers
    the compute efficiency and fits every span; a profile without them cannot."""
    truth = true_platform()
    assert truth.device("cpu0").gemm_row_tiles == (4, 2, 1)
    runs = _optional_runs(tmp_path, truth)
    efficiency = Param("device", CORES, "compute_efficiency")
    with_tiles = fit(TILED, [t for r in runs for t in Terms(TILED).of_run(r)])
    assert with_tiles.values[efficiency] == pytest.approx(0.25, rel=0.01)
    assert with_tiles.median_abs_error < 1e-4
    plain = untiled(TILED)
    without = fit(plain, [t for r in runs for t in Terms(plain).of_run(r)])
    assert without.median_abs_error > 100 * with_tiles.median_abs_error
