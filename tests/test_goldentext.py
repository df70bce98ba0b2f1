"""The per-number comparison of golden outputs a solver writes (tests/goldentext.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.goldentext import (Tolerance, differences, last_digit_unit, load_tolerance,
                              split_numbers)

TOL = Tolerance(rtol=1e-6, atol=1e-9, files=("stdout",))
RECORDED = '{"after": 0.0012295264491815003, "spans": 168, "error": -3.7e-05}\n# 4.3% on 2026-11-26 by cpu0'


def test_numbers_are_taken_out_of_the_text_and_names_stay_text():
    text, numbers = split_numbers("cpu0,cpu1 at 2.73e-05 -> 0.0009411 (sd-1, 168 spans) -3 "
                                  "on 2026-11-26 in 12.")
    assert numbers == ["2.73e-05", "0.0009411", "168", "-3"]
    assert text == "cpu0,cpu1 at \x00 -> \x00 (sd-1, \x00 spans) \x00 on 2026-11-26 in 12."


def test_the_recorded_text_agrees_with_itself():
    assert differences(RECORDED, RECORDED, TOL) == []


def test_a_last_digits_move_within_the_tolerance_passes():
    moved = RECORDED.replace("0.0012295264491815003", "0.0012295264492324855")
    assert differences(moved, RECORDED, TOL) == []


def test_a_rounded_figure_may_round_the_other_way():
    assert differences(RECORDED.replace("4.3%", "4.4%"), RECORDED, TOL) == []
    assert differences(RECORDED.replace("4.3%", "4.5%"), RECORDED, TOL) != []


@pytest.mark.parametrize("moved", [
    RECORDED.replace("0.0012295264491815003", "0.0012295364491815003"),  # 8e-6 relative
    RECORDED.replace("-3.7e-05", "-3.9e-05"),
    RECORDED.replace("168", "169"),  # a count
])
def test_a_number_moved_past_the_tolerance_fails(moved):
    wrong = differences(moved, RECORDED, TOL)
    assert len(wrong) == 1 and "recorded" in wrong[0]


@pytest.mark.parametrize("changed", [
    RECORDED.replace("spans", "span"),
    RECORDED.replace("cpu0", "cpu1"),
    RECORDED.replace("2026-11-26", "2026-11-27"),  # a date is text
    RECORDED + "\n",
    RECORDED.replace(", \"spans\": 168", ""),  # a number fewer
])
def test_any_change_of_the_text_around_the_numbers_fails(changed):
    wrong = differences(changed, RECORDED, TOL)
    assert len(wrong) == 1 and "text" in wrong[0]


def test_last_digit_unit():
    assert last_digit_unit("0.00123") == pytest.approx(1e-5)
    assert last_digit_unit("4.3") == pytest.approx(0.1)
    assert last_digit_unit("2.73e-05") == pytest.approx(1e-7)


def test_the_shipped_tolerance_files_load_and_name_written_files():
    golden = Path(__file__).parent / "golden"
    named = {folder: t for folder in golden.iterdir()
             if folder.is_dir() and (t := load_tolerance(folder)) is not None}
    assert named, "no golden case is compared per number"
    for folder, t in named.items():
        assert 0 < t.rtol <= 1e-6 and 0 < t.atol <= 1e-9
        assert all((folder / name).exists() for name in t.files)
