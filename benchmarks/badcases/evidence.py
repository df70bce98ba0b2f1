"""Class 4 of issue 20, records are evidence: tampered measured runs whose files
disagree with each other (acceptance beyond the proposal, spans on hardware the
record's platform lacks, op kinds outside the schedule vocabulary, span times
past the run's wall time, a Forward larger than the run could feed, inputs a new
run would refuse). ``hetspec replay`` and ``hetspec calibrate --runs`` read every
measured run through one reader (``analyses.measured.replay.load_run``), so each
variant is replayed and calibrated on; both must refuse it in one sentence.

Variant names start with ``e_`` (``h.VARIANTS`` is shared by the classes).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPLAY = "replay <run:{}>/record.json --trace replay.json"
CALIBRATE = "calibrate --profile cpu-local --runs <runs:{}> -o cal.yaml"
SIM_TRACE = ("simulate --platform cpu-local --target smollm2-135m --tokens 50 --policy sd "
             "--set draft_layers=15 --set trace=<{}>")


def register(h) -> None:
    def spans(run: Path) -> list:
        return h.read_jsonl(run / "spans.jsonl")

    def first_span(pick, edits: dict):
        """Edit the first span ``pick(span)`` selects."""
        def corrupt(run: Path) -> None:
            rows = spans(run)
            i = next(i for i, s in enumerate(rows) if pick(s))
            rows[i] = h.edited(rows[i], edits)
            h.write_jsonl(run / "spans.jsonl", rows)
        return corrupt

    def every(name: str, pick, edits: dict):
        """Edit every line ``pick(line)`` selects of a JSON-lines file."""
        def corrupt(run: Path) -> None:
            rows = h.read_jsonl(run / name)
            h.write_jsonl(run / name, [h.edited(r, edits) if pick(r) else r for r in rows])
        return corrupt

    def drop(name: str, pick):
        """Remove the first line ``pick(line)`` selects."""
        def corrupt(run: Path) -> None:
            rows = h.read_jsonl(run / name)
            i = next(i for i, r in enumerate(rows) if pick(r))
            h.write_jsonl(run / name, rows[:i] + rows[i + 1:])
        return corrupt

    def duplicate(name: str, pick):
        def corrupt(run: Path) -> None:
            rows = h.read_jsonl(run / name)
            i = next(i for i, r in enumerate(rows) if pick(r))
            h.write_jsonl(run / name, rows[:i + 1] + rows[i:])
        return corrupt

    def scaled(factor: float):
        def corrupt(run: Path) -> None:
            h.write_jsonl(run / "spans.jsonl", [
                {**s, "start_s": s["start_s"] * factor, "end_s": s["end_s"] * factor}
                for s in spans(run)])
        return corrupt

    def spans_fifo(run: Path) -> None:
        (run / "spans.jsonl").unlink()
        os.mkfifo(run / "spans.jsonl")

    def fifo(name: str):
        def corrupt(run: Path) -> None:
            (run / name).unlink()
            os.mkfifo(run / name)
        return corrupt

    def platform_file(name: str, source=None):
        """A platform profile written in the run folder (or beside it), named by the
        record as ``name``."""
        def corrupt(run: Path) -> None:
            where = (run / name).resolve()
            where.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source or h.PLATFORMS / "cpu-local.yaml", where)
            h.record({"inputs.platform": name})(run)
        return corrupt

    def all_accepted(extra: int):
        """Every Verify line claims its whole proposal accepted (plus ``extra``),
        committing one bonus token more, as if the draft had never missed."""
        def corrupt(run: Path) -> None:
            rows = h.read_jsonl(run / "acceptance.jsonl")
            for d in rows:
                if "accepted" in d:
                    d["accepted"] = [p + extra for p in d["proposed"]]
                    d["committed"] = [p + extra + 1 for p in d["proposed"]]
            h.write_jsonl(run / "acceptance.jsonl", rows)
        return corrupt

    verify = lambda d: "accepted" in d  # noqa: E731
    target_forward = lambda s: (s["op"]["type"] == "Forward"  # noqa: E731
                                and s["op"].get("model") == "target"
                                and s["op"].get("device") == "target")
    forward = lambda s: s["op"]["type"] == "Forward"  # noqa: E731
    verify_span = lambda s: s["op"]["type"] == "Verify"  # noqa: E731
    proposing = lambda d: "accepted" in d and (d.get("proposed") or [0])[0] > 0  # noqa: E731

    variants = {
        # the review's tampered records (N5, N9)
        "e_acc_over_gamma": every("acceptance.jsonl", verify, {"accepted": [50]}),
        "e_platform_h100": h.record({"inputs.platform": "h100-sxm-5x"}),
        "e_spans_unknown_device": first_span(forward, {"device": "gpu7"}),
        "e_spans_unknown_op": first_span(forward, {"op.type": "Bogus"}),
        "e_spans_ntokens_1e9": first_span(target_forward, {"op.n_tokens": 10**9}),
        "e_spans_end_1e300": first_span(verify_span, {"end_s": 1e300}),
        "e_memory_check_maybe": h.record({"inputs.memory_check": "maybe"}),
        "e_prefill_chunk_0": h.record({"inputs.prefill_chunk": 0}),
        "e_prompt_tokens_1e9": h.record({"inputs.prompt_tokens": 10**9}),
        "e_expert_parallel_dense": h.record({"inputs.expert_parallel": True}),
        "e_weight_bits_4": h.record({"inputs.weight_bits": 4}),
        "e_platform_etc_passwd": h.record({"inputs.platform": "/etc/passwd"}),
        "e_spans_fifo": spans_fifo,
        # more of the class: the inputs a new run would refuse
        "e_kv_bits_8": h.record({"inputs.kv_bits": 8}),
        "e_prefill_chunk_64": h.record({"inputs.prefill_chunk": 64}),
        "e_seed_negative": h.record({"inputs.seed": -1}),
        "e_batch_over_cap": h.record({"inputs.batch": 10**6}),
        "e_deterministic_str": h.record({"inputs.deterministic": "maybe"}),
        "e_placement_gpu": h.record({"inputs.placement": {"target": "gpu0"}}),
        # the platform the record names
        "e_platform_dotdot": platform_file("../elsewhere.yaml"),
        "e_platform_abs_shipped": h.record(
            {"inputs.platform": str(h.PLATFORMS / "cpu-local.yaml")}),
        "e_platform_proc": h.record({"inputs.platform": "/proc/self/environ"}),
        "e_platform_in_folder_h100": platform_file(
            "platform.yaml", h.PLATFORMS / "h100-sxm-5x.yaml"),
        "e_platform_in_folder": platform_file("platform.yaml"),
        # spans against the platform, the placement and the run's time
        "e_forward_wrong_device": first_span(target_forward, {"device": "cpu1"}),
        "e_span_link_unknown": first_span(forward, {"device": "link:nowhere"}),
        "e_span_negative_start": first_span(forward, {"start_s": -5.0}),
        "e_spans_scaled_1000": scaled(1000.0),
        "e_span_context_1e12": first_span(forward, {"op.context": 10**12}),
        "e_span_n_fed_1e8": first_span(target_forward, {"op.n_fed": 10**8}),
        "e_verify_span_dropped": drop("spans.jsonl", verify_span),
        # the acceptance trace against its proposals, the spans and the metrics
        "e_acc_over_proposed": every("acceptance.jsonl", proposing,
                                     {"accepted": lambda a: [a[0] + 5]}),
        "e_acc_one_over": all_accepted(1),
        "e_acc_all_accepted": all_accepted(0),
        "e_acc_committed_5": every("acceptance.jsonl", verify, {"committed": [5]}),
        "e_acc_rows_mismatch": every("acceptance.jsonl", verify, {"proposed": [3, 3]}),
        "e_acc_line_dropped": drop("acceptance.jsonl", verify),
        "e_acc_line_doubled": duplicate("acceptance.jsonl", verify),
        "e_steps_inflated": h.record({"metrics.steps": lambda n: n + 5}),
        "e_tokens_x10": h.record({"metrics.tokens": lambda n: n * 10}),
        # files that are pipes: refused by a stat, never opened (a read would block)
        "e_record_fifo": fifo("record.json"),
        "e_acceptance_fifo": fifo("acceptance.jsonl"),
    }
    h.VARIANTS.update(variants)

    replayed = list(variants)
    calibrated = ["e_acc_over_gamma", "e_platform_h100", "e_spans_unknown_device",
                  "e_spans_unknown_op", "e_spans_ntokens_1e9", "e_spans_end_1e300",
                  "e_memory_check_maybe", "e_weight_bits_4", "e_platform_etc_passwd",
                  "e_spans_fifo", "e_forward_wrong_device", "e_spans_scaled_1000",
                  "e_acc_line_dropped", "e_tokens_x10", "e_placement_gpu",
                  "e_record_fifo"]
    accepted = {"e_platform_in_folder"}
    rows = [(f"e{n:02d}", f"replay tampered run '{v[2:]}'", REPLAY.format(v))
            for n, v in enumerate(replayed, 1)]
    rows += [(f"e{n:02d}", f"calibrate on tampered run '{v[2:]}'", CALIBRATE.format(v))
             for n, v in enumerate(calibrated, 60)]
    # the acceptance rule holds wherever a trace is read: simulate --set trace=
    h.FIXTURES["e_acc_over_gamma.jsonl"] = h.text(
        '{"accepted": [50], "gamma": 4, "proposed": [4], "committed": [51]}\n')
    h.FIXTURES["e_acc_gamma_only.jsonl"] = h.text('{"accepted": [5], "gamma": 4}\n')
    h.FIXTURES["e_acc_committed.jsonl"] = h.text(
        '{"accepted": [1], "gamma": 4, "proposed": [4], "committed": [3]}\n')
    rows += [("e80", "simulate with a trace accepting 50 of gamma 4",
              SIM_TRACE.format("e_acc_over_gamma.jsonl")),
             ("e81", "simulate with a trace accepting 5 of gamma 4 (no 'proposed')",
              SIM_TRACE.format("e_acc_gamma_only.jsonl")),
             ("e82", "simulate with a trace committing 2 more than it accepted",
              SIM_TRACE.format("e_acc_committed.jsonl")),
             # a replay on other hardware is no option of replay: --profile must match
             ("e83", "replay a good run on another platform's profile",
              "replay <run:good>/record.json --profile h100-sxm-5x --trace replay.json"),
             # the untampered run still replays
             ("e90", "replay the untampered run", REPLAY.format("good"))]
    for cid, variant in [(r[0], r[2]) for r in rows]:
        if any(f"<run:{v}>" in variant or f"<runs:{v}>" in variant for v in accepted):
            h.EXPECT[cid] = "accept"
    h.EXPECT["e90"] = "accept"
    h.CASES_TABLE.extend(rows)
