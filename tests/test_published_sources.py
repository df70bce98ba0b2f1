"""The published set by source: the folder loader, the by-source split, the
acceptance matched to a printed mean, and the held-out summary's arithmetic."""

from __future__ import annotations

import shutil

import pytest
import yaml

from analyses.calibrate import heldout, publishedcal
from analyses.calibrate.accepted import match_alpha, tokens_per_step
from analyses.calibrate.draftstep import simulate_row_full
from analyses.calibrate.published import (Measurement, load_published, shipped_file,
                                          shipped_folder, sources_of)
from analyses.calibrate.sources import runnable
from hwprofiles import load_platform

from benchscripts import load_benchmark

SOURCE = {"id": "src-x", "name": "a source", "url": "https://example.org/x",
          "stack": "hf-eager", "device_class": "datacenter-gpu", "hardware": "an A100",
          "measures": "speedups", "role": "held_out"}


def _row(rid, **extra):
    row = {"id": rid, "platform": "a100-sxm-8x", "hardware": "1x A100", "target": "llama-2-7b",
           "policy": "ar", "tokens_per_s": 50.0, "source": "a table, a cell"}
    row.update(extra)
    return row


def _write(folder, name, data):
    (folder / name).write_text(yaml.safe_dump(data, sort_keys=False))


def test_shipped_folder_loads_with_every_row_sourced():
    rows = load_published(shipped_folder())
    sources = sources_of(shipped_folder())
    assert len(rows) >= 80 and len(sources) >= 6
    assert len({r.id for r in rows}) == len(rows)
    for r in rows:
        assert r.url and r.source and r.source_id in sources, r.id
        assert r.stack and r.device_class, r.id
    assert len({r.stack for r in rows}) >= 3
    assert len({r.device_class for r in rows}) >= 4
    assert any(r.speedup is not None and r.mean_accepted_tokens for r in rows)
    # the calibration file alone still loads, its rows a subset of the folder's
    assert {r.id for r in load_published(shipped_file())} <= {r.id for r in rows}


def test_an_id_twice_across_files_is_refused(tmp_path):
    _write(tmp_path, "a.yaml", {"source": SOURCE, "measurements": [_row("r1")]})
    _write(tmp_path, "b.yaml", {"source": {**SOURCE, "id": "src-y", "url": "https://e.org/y"},
                                "measurements": [_row("r1")]})
    with pytest.raises(ValueError, match="r1' appears twice"):
        load_published(tmp_path)


def test_a_source_declared_twice_must_agree(tmp_path):
    _write(tmp_path, "a.yaml", {"source": SOURCE, "measurements": [_row("r1")]})
    _write(tmp_path, "b.yaml", {"source": {**SOURCE, "role": "fit"},
                                "measurements": [_row("r2")]})
    with pytest.raises(ValueError, match="src-x is declared elsewhere"):
        load_published(tmp_path)


def test_a_held_out_sources_row_cannot_be_fitted(tmp_path):
    _write(tmp_path, "a.yaml", {"source": SOURCE, "measurements": [_row("r1", split="fit")]})
    with pytest.raises(ValueError, match="held-out source is never fitted"):
        load_published(tmp_path)


def test_rows_inherit_their_source(tmp_path):
    _write(tmp_path, "a.yaml", {"source": SOURCE, "measurements": [
        _row("r1"), _row("r2", stack="llama.cpp", device_class="apple-unified")]})
    r1, r2 = load_published(tmp_path)
    assert (r1.split, r1.source_id, r1.url, r1.stack, r1.device_class) == (
        "held_out", "src-x", SOURCE["url"], "hf-eager", "datacenter-gpu")
    assert (r2.stack, r2.device_class) == ("llama.cpp", "apple-unified")


def test_a_row_url_must_name_one_of_the_files_sources(tmp_path):
    other = {**SOURCE, "id": "src-y", "url": "https://e.org/y", "role": "fit"}
    _write(tmp_path, "a.yaml", {"sources": [SOURCE, other],
                                "measurements": [_row("r1", url="https://e.org/z")]})
    with pytest.raises(ValueError, match="names none of the file's sources"):
        load_published(tmp_path)


@pytest.mark.parametrize("extra, message", [
    ({"speedup": 1.5}, "exactly one of tokens_per_s, speedup, time_per_token_ms and "
                       "batch_latency_s"),
    ({"time_per_token_ms": 20.0}, "exactly one of tokens_per_s, speedup"),
    ({"batch_latency_s": 1.0}, "exactly one of tokens_per_s, speedup"),
    ({"tokens_per_s": None, "speedup": 1.5}, "an ar row has no speedup"),
    ({"tokens_per_s": None, "speedup": 1.5, "policy": "sd", "draft": "llama-3.2-1b"},
     "needs the acceptance"),
])
def test_what_a_row_prints_is_checked(extra, message):
    with pytest.raises(ValueError, match=message):
        Measurement.model_validate({**_row("r1", split="held_out"), **extra})


def test_held_out_sources_are_never_fitted(monkeypatch, tmp_path):
    """A calibration on the shipped folder fits only rows of sources whose role is
    fit, and judges the held-out sources' rows of its platform."""
    fitted_ids = []
    real = publishedcal.fit_rows

    def spy(platform, rows, fields, **kw):
        fitted_ids.extend(r.id for r in rows)
        return real(platform, rows, fields, **kw)

    monkeypatch.setattr(publishedcal, "fit_rows", spy)
    folder = tmp_path / "published"
    shutil.copytree(shipped_folder(), folder)
    # the Orin has a fitted source (embedl) and held-out ones (TinyChat, HoloHub)
    summary = publishedcal.calibrate_published(folder, "jetson-agx-orin-64gb",
                                               tmp_path / "c.yaml",
                                               fields=("memory_bandwidth_gb_s",))
    rows = {r.id: r for r in load_published(folder)}
    roles = {sid: s.role for sid, s in sources_of(folder).items()}
    assert fitted_ids and all(roles[rows[i].source_id] == "fit" for i in fitted_ids)
    judged = {t["id"] for t in summary["rows"]}
    assert any(roles[rows[i].source_id] == "held_out" for i in judged)


def test_fitted_sources_are_the_ones_shipped_profiles_name():
    rows = load_published(shipped_folder())
    sources = sources_of(shipped_folder())
    texts = heldout.platform_source_texts(
        [load_platform(n) for n in sorted({r.platform for r in rows})])
    fitted = heldout.fitted_sources(rows, sources, texts, {})
    assert {"gpt-fast", "ssd"} <= set(fitted)
    assert "spec-bench" not in fitted and "executorch-llama" not in fitted
    # a stack's fitted_on naming a source makes it fitted
    assert "spec-bench" in heldout.fitted_sources(rows, sources, texts,
                                                  {"hf-eager": ("spec-bench",)})


def test_matched_acceptance_commits_the_printed_mean():
    row = next(r for r in load_published(shipped_folder())
               if r.id == "specbench-a100-vicuna7b-sps")
    platform = load_platform(row.platform)
    config = runnable(row)[0].config()  # tokens per step do not depend on the stack
    alpha = match_alpha(config, row.mean_accepted_tokens, platform)
    got = tokens_per_step(config.revised(acceptance={"kind": "iid", "alpha": alpha}),
                          platform)
    assert got == pytest.approx(row.mean_accepted_tokens, rel=0.01)
    with pytest.raises(ValueError, match="more than sd"):
        match_alpha(config, 7.5, platform)  # gamma 5 commits at most 6 per step


def test_summary_arithmetic_on_a_fixture():
    def m(rid, published, measure="tokens/s", ranking=None):
        extra = ({"tokens_per_s": published} if measure == "tokens/s" else
                 {"tokens_per_s": None, "speedup": published, "policy": "sd",
                  "draft": "llama-3.2-1b", "mean_accepted_tokens": 2.0})
        return Measurement.model_validate({**_row(rid, split="held_out"), **extra,
                                           "ranking": ranking})

    rows = [m("a", 100.0, ranking="g"), m("b", 50.0, ranking="g"), m("c", 10.0),
            m("s1", 2.0, "speedup"), m("s2", 1.5, "speedup")]
    simulated = {"a": 110.0, "b": 130.0, "c": 7.0, "s1": 2.2, "s2": 1.8}
    # errors: +10%, +160%, -30%, +10%, +20%
    s = heldout.summarise(rows, simulated)
    assert s.rows == 5
    assert s.median_abs == pytest.approx(0.20)
    assert (s.worst_abs, s.worst_row) == (pytest.approx(1.6), "b")
    assert (s.tokens_within, s.tokens_rows) == (1, 3)  # a only (c is 30% off)
    assert (s.speedup_within, s.speedup_rows) == (1, 2)  # s1 only (s2 is 20% off)
    assert s.flips == [("a", "b")]  # published a > b, simulated a < b
    assert s.share(1, 3) == "1/3 (33%)" and s.share(0, 0) == "n/a"
    assert heldout.regime_of(rows[3]) == ("compiled", "unknown", "speculative")


def test_a_row_printing_ms_per_token_is_compared_in_ms():
    row = next(r for r in load_published(shipped_folder())
               if r.id == "tinychat-orin-llama2-7b-fp16")
    platform = load_platform(row.platform)
    as_rate = row.model_copy(update={"time_per_token_ms": None, "tokens_per_s": 10.0})
    ms = simulate_row_full(row, platform)[0]
    rate = simulate_row_full(as_rate, platform)[0]
    assert row.measure == "ms/token" and ms == pytest.approx(1e3 / rate, rel=1e-12)


def test_the_held_out_sources_include_a_speculative_one_with_its_printed_tau():
    """The shipped set holds held-out sources of speculative speedups (EAGLE-3's
    EAGLE-2 rows and the Spec-Bench leaderboard at batch 1, LLM-Inference-Bench's
    vLLM runs at batch 1 and 64, GPUStack's SGLang EAGLE-3 runs at concurrency
    4, SpecDecode-Bench's vLLM draft models at batch 1-128): nothing shipped is
    fitted on them, and each
    batch-1 row gives the tau it printed, so the summary counts speedups, not
    only absolute speeds."""
    from hwprofiles import list_names, load_stack
    rows = load_published(shipped_folder())
    sources = sources_of(shipped_folder())
    texts = heldout.platform_source_texts(
        [load_platform(n) for n in sorted({r.platform for r in rows})])
    stacks = {n: load_stack(n).fitted_on for n in list_names("stacks")}
    fitted = heldout.fitted_sources(rows, sources, texts, stacks)
    spec = [r for r in rows if r.source_id not in fitted and r.measure == "speedup"]
    at_batch = {"llm-inference-bench-sd", "gpustack-sglang-eagle3-h100", "specdecode-bench-sd"}
    assert {r.source_id for r in spec} == {"eagle3-paper", "spec-bench"} | at_batch
    assert "eagle2-paper" in fitted  # what hf-eager is fitted on judges nothing
    at_one = [r for r in spec if r.source_id not in at_batch]
    assert all(r.mean_accepted_tokens and r.stack == "hf-eager" for r in at_one)
    assert {r.batch for r in spec} == {1, 4, 16, 64, 128}
    assert {r.params.get("temperature", 0) for r in spec if r.source_id == "eagle3-paper"} == {0, 1}


def test_bench_published_prices_every_row_under_another_stack_when_asked(tmp_path):
    bench = load_benchmark("bench_published")
    shutil.copy(shipped_folder() / "tinychat-awq.yaml", tmp_path)
    own = bench.report(False, True, tmp_path)
    what_if = bench.report(False, True, tmp_path, under_stack="compiled")
    row = "tinychat-orin-llama3-8b-fp16"
    assert next(x for x in own if x.startswith(row)) != next(
        x for x in what_if if x.startswith(row))
    assert any("priced under stack compiled" in line for line in what_if)
    assert not any("priced under stack" in line for line in own)


def test_each_missed_regime_is_fitted_on_a_second_source_and_judged_by_its_first():
    """The phone CPU is fitted on react-native-executorch's rows and the llama.cpp
    stack's Jetson host time on the Ollama Orin row; the ExecuTorch README and
    HoloHub, the first sources of those regimes, stay held out."""
    from hwprofiles import list_names, load_stack
    folder = shipped_folder()
    rows = load_published(folder)
    texts = heldout.platform_source_texts(
        [load_platform(n) for n in sorted({r.platform for r in rows})])
    stacks = {n: load_stack(n).fitted_on for n in list_names("stacks")}
    fitted = heldout.fitted_sources(rows, sources_of(folder), texts, stacks)
    assert fitted["rn-executorch-bench"] == "platform snapdragon-8-gen3"
    assert fitted["ollama-agx-orin"] == "stack llama.cpp"
    assert "executorch-llama" not in fitted and "holohub-igx-orin" not in fitted
    # the Ollama row fits the stack, not the Orin platform's bandwidth
    assert next(r for r in rows if r.source_id == "ollama-agx-orin").split == "held_out"


def test_the_phone_cpu_reproduces_the_rows_it_was_fitted_on():
    """The fitted rows' errors the profile's sources state (within 6.9%)."""
    rows = [r for r in load_published(shipped_folder())
            if r.source_id == "rn-executorch-bench"]
    platform = load_platform("snapdragon-8-gen3")
    assert len(rows) == 6 and all(r.split == "fit" for r in rows)
    for r in rows:
        simulated = simulate_row_full(r, platform, {})[0]
        assert abs(simulated / r.published - 1) < 0.07, r.id


def test_a_batch_latency_row_is_simulated_as_its_batchs_prefill_and_decoding():
    """A row printing a batch's end-to-end seconds (batch_latency_s) is simulated as
    the run's prefill plus its decoding steps, at the row's batch and under its stack;
    bench_published counts it among the absolute measures."""
    from analyses.run.api import run_schedule
    from hwprofiles import load_platform

    rows = [r for r in load_published(shipped_folder())
            if r.source_id == "llm-inference-bench-vllm" and r.batch == 16]
    row = rows[0]
    assert row.measure == "s/batch" and row.published == row.batch_latency_s
    platform = load_platform(row.platform)
    config = row.config(None)
    assert (config.batch, config.stack) == (16, "vllm")
    result = run_schedule(config, record_spans=False, platform=platform)
    simulated = simulate_row_full(row, platform)[0]
    assert simulated == pytest.approx(result.prefill_s + result.time_s, rel=1e-12)
    assert result.prefill_s > 0


def test_an_end_to_end_speedup_divides_whole_runs_prefill_included():
    """A row whose source printed whole-run throughputs (``speedup_of: end_to_end``)
    is simulated as the AR run's prefill and decoding over the speculative run's;
    the same row as a decode speedup divides decode rates, and at batch 64, where
    the prefill is a tenth of the run, the two differ."""
    from analyses.run.api import baseline_config, run_schedule

    row = next(r for r in load_published(shipped_folder())
               if r.id == "lib-sd-a100-llama2-7b-L128-b64")
    platform = load_platform(row.platform)
    sd = run_schedule(row.config(), record_spans=False, platform=platform)
    ar = run_schedule(baseline_config(row.config()), record_spans=False, platform=platform)
    whole = (ar.prefill_s + ar.time_s) / (sd.prefill_s + sd.time_s)
    decode = (sd.tokens / sd.time_s) / (ar.tokens / ar.time_s)
    assert simulate_row_full(row, platform)[0] == pytest.approx(whole, rel=1e-12)
    as_decode = row.model_copy(update={"speedup_of": "decode"})
    assert simulate_row_full(as_decode, platform)[0] == pytest.approx(decode, rel=1e-12)
    assert abs(whole / decode - 1) > 0.01
    with pytest.raises(ValueError, match="speedup_of without a speedup"):
        Measurement.model_validate({**row.model_dump(), "speedup": None,
                                    "tokens_per_s": 100.0, "speedup_of": "end_to_end"})


def test_docs_list_every_published_file_and_count_its_rows():
    """docs/calibration.md's table of sources names every shipped published file, and
    its count line says how many rows and sources the folder holds."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "calibration.md").read_text()
    files = sorted(p.name for p in shipped_folder().glob("*.yaml"))
    assert [f for f in files if f"`{f}`" not in text] == []
    rows = load_published(shipped_folder())
    count = f"{len(rows)} rows, {len({r.source_id for r in rows})} sources"
    assert count in " ".join(text.split())
