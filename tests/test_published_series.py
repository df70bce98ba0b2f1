"""Speedup series against batch in the published set: the arithmetic of judging a
curve (error per batch, where it crosses 1, the crossover verdict), the
SpecDecode-Bench rows held out at an a-priori acceptance, and the bench's table."""

from __future__ import annotations

import shutil

import pytest
import yaml

from analyses.calibrate import heldout
from analyses.calibrate.published import Measurement, load_published, shipped_folder, sources_of
from analyses.calibrate.series import CROSSOVER_FACTOR, SERIES_GOAL, Series, series_of
from policies.runs.metrics import stops_paying
from hwprofiles import list_names, load_platform, load_stack
from simcore.acceptance import default as acceptance_default

from benchscripts import load_benchmark

SOURCE_ID = "specdecode-bench-sd"
FILE = "specdecode-bench-sd.yaml"


def _series(measured, predicted, batches=(1, 16, 64, 128)):
    return Series("src", "curve", tuple(f"r{b}" for b in batches), tuple(batches),
                  tuple(measured), tuple(predicted))


def test_a_series_is_judged_at_every_batch():
    goal = SERIES_GOAL
    inside = [1.0 + goal / 2, 1.0 - goal / 2, 1.0, 1.0 + goal]
    s = _series([2.0, 1.5, 1.2, 1.1], [m * f for m, f in zip([2.0, 1.5, 1.2, 1.1], inside)])
    assert s.errors == pytest.approx([f - 1 for f in inside])
    assert s.within
    outside = inside[:3] + [1.0 + 2 * goal]
    assert not _series(s.measured, [m * f for m, f in zip(s.measured, outside)]).within


def test_the_crossover_is_the_compare_sweeps_and_judged_within_the_factor():
    measured = [1.4, 1.2, 1.05, 0.9]
    s = _series(measured, measured)
    want = stops_paying(list(s.batches), measured)[2]
    assert s.measured_crossover == pytest.approx(want) and 64 < want < 128
    assert s.predicted_crossover == pytest.approx(want) and s.crossover_verdict == "yes"
    # crossing below the measured batch by more than the factor is a miss
    early = [1.2, 0.9, 0.8, 0.7]
    missed = _series(measured, early)
    assert missed.measured_crossover / missed.predicted_crossover > CROSSOVER_FACTOR
    assert missed.crossover_verdict == "no"
    # neither crosses: nothing to judge; one crosses past half the last batch: open
    assert _series([2, 1.8, 1.5, 1.2], [2, 1.7, 1.4, 1.1]).crossover_verdict == "none"
    assert _series(measured, [1.5, 1.4, 1.3, 1.2]).crossover_verdict == "open"
    # the measured one crosses early and the simulated never: a miss
    assert _series(early, [1.5, 1.4, 1.3, 1.2]).crossover_verdict == "no"


def _row(rid, batch, speedup, series="curve"):
    return Measurement.model_validate(
        {"id": rid, "platform": "h100-sxm-8x", "hardware": "1x H100", "target": "qwen3-8b",
         "draft": "qwen3-0.6b", "policy": "sd", "acceptance": acceptance_default(),
         "batch": batch, "speedup": speedup, "series": series, "split": "held_out",
         "source": "a figure", "source_id": "src"})


def test_series_are_grouped_by_name_sorted_by_batch_and_a_batch_twice_is_refused():
    rows = [_row("b", 16, 1.2), _row("a", 1, 1.5), _row("lone", 1, 1.1, "other")]
    found = series_of(rows, {"a": 1.4, "b": 1.3, "lone": 1.0})
    assert [(s.name, s.batches, s.predicted) for s in found] == [("curve", (1, 16), (1.4, 1.3))]
    with pytest.raises(ValueError, match="two rows at one batch"):
        series_of(rows + [_row("c", 16, 1.1)], {"a": 1, "b": 1, "c": 1, "lone": 1})


def _shipped_rows():
    return [r for r in load_published(shipped_folder()) if r.source_id == SOURCE_ID]


def test_specdecode_bench_is_held_out_at_the_a_priori_acceptance():
    """Every row is held out, nothing shipped is fitted on the source, and every row
    takes hetspec's default acceptance (none is printed for k=3, and none is solved
    from the speedups): the rows differ only in batch, pair and the printed speedup."""
    rows = _shipped_rows()
    all_rows = load_published(shipped_folder())
    texts = heldout.platform_source_texts(
        [load_platform(n) for n in sorted({r.platform for r in all_rows})])
    stacks = {n: load_stack(n).fitted_on for n in list_names("stacks")}
    fitted = heldout.fitted_sources(all_rows, sources_of(shipped_folder()), texts, stacks)
    assert rows and SOURCE_ID not in fitted
    assert sources_of(shipped_folder())[SOURCE_ID].role == "held_out"
    assert all(r.split == "held_out" and r.series for r in rows)
    assert all(r.acceptance == acceptance_default() for r in rows)
    assert all(r.speedup_of == "end_to_end" and r.params == {"gamma": 3} for r in rows)
    assert {load_stack(r.stack).scoring for r in rows} == {"multi_query"}


def test_specdecode_bench_rows_are_the_serving_files_draft_model_curves():
    """The rows carry the serving-evidence file's speedups for every draft-model
    series whose target and draft are shipped, at every batch it reports."""
    data = yaml.safe_load((shipped_folder() / "serving" / "specdecode-bench-vllm-h100.yaml")
                          .read_text())
    rows = {(r.series, r.batch): r.speedup for r in _shipped_rows()}
    printed = {(r["series"], r["load"]): r["speedup"] for r in data["rows"]
               if r["series"].endswith("/draft-k3")}
    assert rows == printed


def test_bench_published_prints_each_series_per_batch_and_its_crossover(tmp_path):
    bench = load_benchmark("bench_published")
    shutil.copy(shipped_folder() / FILE, tmp_path)
    lines = bench.report(False, False, tmp_path)
    for name in sorted({r.series for r in _shipped_rows()}):
        line = next(x for x in lines if f" {name} " in x)
        assert "1 / 16 / 64 / 128" in line
    assert any(x.startswith("held-out speedup series against batch:") for x in lines)
    assert any("crossover batch within" in x for x in lines)


def test_series_level_solves_the_smallest_batchs_acceptance_and_judges_the_rest():
    """benchmarks/series_level.py: the alpha solved on a series' batch-1 row
    reproduces that row's printed speedup, the speedup rises with alpha, and the other
    batches are simulated at it; only held-out series without printed acceptance are
    taken."""
    level = load_benchmark("series_level")
    found = level.series_rows(load_published(shipped_folder()), SOURCE_ID)
    assert len(found) == 8 and all(k[0] == SOURCE_ID for k in found)
    mine = found[(SOURCE_ID, "qwen3-8b/sharegpt/draft-k3")]
    assert [r.batch for r in mine] == [1, 16, 64, 128]
    platform = load_platform(mine[0].platform)
    alpha, rest = level.level_series(mine, platform)

    def speedup(row, a):
        return level.speedup_at(row, platform, a)

    # a deterministic run commits whole rounds, so the speedup is a fine staircase in
    # alpha: the printed speedup lies on the step the bisection closes on (under 1%)
    below, above = speedup(mine[0], alpha - 1e-6), speedup(mine[0], alpha + 1e-6)
    assert below <= mine[0].speedup <= above and above / below - 1 < 0.01
    assert alpha < acceptance_default()["alpha"]  # ShareGPT pays less than the a-priori 0.8
    assert speedup(mine[0], alpha - 0.05) < below
    assert [b for b, _, _ in rest] == [16, 64, 128]
    assert rest[0][2] == pytest.approx(speedup(mine[1], alpha), rel=1e-12)


def test_series_level_skips_series_whose_rows_print_their_acceptance():
    level = load_benchmark("series_level")
    rows = _shipped_rows()
    printed = [r.model_copy(update={"mean_accepted_tokens": 2.5}) for r in rows]
    assert level.series_rows(printed, SOURCE_ID) == {}
    fitted = [r.model_copy(update={"split": "fit"}) for r in rows]
    assert level.series_rows(fitted, SOURCE_ID) == {}
