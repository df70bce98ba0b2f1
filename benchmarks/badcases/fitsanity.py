"""Calibration sanity (issue 20, class 3; review N4): published rows in a wrong
unit, fits whose numbers end on a bound or that the rows cannot identify,
fitted rows that stay far off, and calibrate options that would be silently
ignored. The valid shipped calibrations (ids ending in 'v') must still be written."""

from __future__ import annotations

import yaml

PUB = "calibrate --profile a100-sxm-8x -o cal.yaml --published"
RUNS = "calibrate --profile cpu-local --runs <runs> -o cal.yaml"


def _a100_rows(h) -> list[dict]:
    path = h.REPO / "hwprofiles" / "data" / "published" / "measurements.yaml"
    rows = yaml.safe_load(path.read_text())["measurements"]
    return [r for r in rows if r["platform"] == "a100-sxm-8x"]


def published(h, speed, keep=lambda row: True):
    """A published file of the shipped a100 rows, each row's tokens/s from
    ``speed(row)`` (``keep`` picks rows)."""
    def write(path):
        rows = [dict(r, tokens_per_s=speed(r)) for r in _a100_rows(h) if keep(r)]
        path.write_text(yaml.safe_dump({"measurements": rows}, sort_keys=False))
    return write


def _one(row_id: str, value):
    """tokens/s of row ``row_id`` set to ``value``, the others as published."""
    return lambda r: value if r["id"] == row_id else r["tokens_per_s"]


TP1, TP2 = "gptfast-a100-llama2-7b-tp1", "gptfast-a100-llama2-7b-tp2"
B70 = "gptfast-a100-llama2-70b-tp8"


def fixtures(h) -> dict:
    def tps(r):
        return r["tokens_per_s"]
    return {
        "pub_1e9.yaml": published(h, lambda r: 1e9),
        "pub_tiny.yaml": published(h, lambda r: 1e-9),
        "pub_ms_units.yaml": published(h, lambda r: round(1000 / tps(r), 3)),
        "pub_per_min.yaml": published(h, lambda r: tps(r) * 60),
        "pub_x3.yaml": published(h, lambda r: tps(r) * 3),
        "pub_x100.yaml": published(h, lambda r: tps(r) * 100),
        "pub_x1000.yaml": published(h, lambda r: tps(r) * 1000),
        "pub_x1e-5.yaml": published(h, lambda r: tps(r) * 1e-5),
        "pub_s_per_token.yaml": published(h, lambda r: round(1 / tps(r), 6)),
        "pub_fit_row_1e9.yaml": published(h, _one(TP1, 1e9)),
        "pub_held_row_tiny.yaml": published(h, _one(TP2, 1e-9)),
        "pub_70b_x150.yaml": published(h, lambda r: tps(r) * 150 if r["id"] == B70 else tps(r)),
        "pub_x0.3.yaml": published(h, lambda r: tps(r) * 0.3 if "7b" in r["id"] else tps(r)),
        "pub_one_fit_row.yaml": published(
            h, tps, lambda r: r["id"] == TP1 or r["split"] == "held_out"),
        "pub_noise.yaml": published(h, lambda r: round(tps(r) * (1.02 if len(r["id"]) % 2
                                                               else 0.98), 3)),
    }


def register(h) -> None:
    h.FIXTURES.update(fixtures(h))
    cases = [
        # review N4: absurd published numbers (cp26, cp27, cp16)
        ("f01", "every row 1e9 tok/s (review cp26)", f"{PUB} <pub_1e9.yaml>"),
        ("f02", "every row 1e-9 tok/s (review cp27)", f"{PUB} <pub_tiny.yaml>"),
        ("f03", "ms/token typed as tok/s (review cp16)", f"{PUB} <pub_ms_units.yaml>"),
        ("f04", "tokens per minute typed as tok/s (60x)", f"{PUB} <pub_per_min.yaml>"),
        ("f05", "every row 3x faster than the hardware allows", f"{PUB} <pub_x3.yaml>"),
        ("f06", "every row 1000x (a unit prefix)", f"{PUB} <pub_x1000.yaml>"),
        ("f07", "every row 1e-5x", f"{PUB} <pub_x1e-5.yaml>"),
        ("f08", "s/token typed as tok/s", f"{PUB} <pub_s_per_token.yaml>"),
        ("f09", "one fitted row 1e9 tok/s, the others right", f"{PUB} <pub_fit_row_1e9.yaml>"),
        ("f10", "one held-out row 1e-9 tok/s", f"{PUB} <pub_held_row_tiny.yaml>"),
        ("f11", "one 70B row 150x its published speed", f"{PUB} <pub_70b_x150.yaml>"),
        ("f12", "7B rows 0.3x, 70B rows right: no one efficiency fits both",
         f"{PUB} <pub_x0.3.yaml>"),
        ("f13", "1e9 tok/s with --accept-poor-fit (a unit mistake is not a poor fit)",
         f"{PUB} <pub_1e9.yaml> --accept-poor-fit"),
        # options that were silently ignored or repeated (review cpA1, cp97)
        ("f14", "--fit-terms with --published (review cpA1)",
         f"{PUB} shipped --fit-terms memory_half_bytes"),
        ("f15", "--fit-fields repeated (review cp97)",
         f"{PUB} shipped --fit-fields memory_efficiency,memory_efficiency"),
        ("f16", "--fit-fields repeated with spaces",
         f"{PUB} shipped --fit-fields 'memory_efficiency, launch_overhead_s ,memory_efficiency'"),
        ("f17", "--fit-fields empty item", f"{PUB} shipped --fit-fields memory_efficiency,,alpha_s"),
        ("f18", "--fit-fields trailing comma", f"{PUB} shipped --fit-fields memory_efficiency,"),
        ("f19", "--fit-fields one knob twice with different starts",
         f"{PUB} shipped --fit-fields call_overhead_s@gpu0=1e-5,call_overhead_s@gpu0=2e-5"),
        ("f20", "--fit-policies with --published", f"{PUB} shipped --fit-policies ar"),
        ("f21", "--fit-fields with --runs", f"{RUNS} --fit-fields memory_efficiency"),
        ("f22", "--fit-draft-steps with --runs", f"{RUNS} --fit-draft-steps"),
        ("f23", "--fit-policies repeated", f"{RUNS} --fit-policies ar,ar"),
        ("f24", "--fit-policies empty item", f"{RUNS} --fit-policies ar,,sd"),
        ("f25", "--fit-terms repeated", f"{RUNS} --fit-terms memory_half_bytes,memory_half_bytes"),
        ("f26", "--fit-terms empty item", f"{RUNS} --fit-terms memory_half_bytes,"),
        ("f27", "--fit-fields compute_efficiency alone on memory-bound rows",
         f"{PUB} shipped --fit-fields compute_efficiency"),
        ("f28", "rows 3x too fast, memory efficiency alone fitted",
         f"{PUB} <pub_x3.yaml> --fit-fields memory_efficiency"),
        # valid calibrations and poor fits the user accepts: written, exit 0
        ("f29v", "README example: --published shipped on a100-sxm-8x", f"{PUB} shipped"),
        ("f30v", "--published shipped on m2-ultra-8x (efficiency starts at its limit 1)",
         "calibrate --published shipped --profile m2-ultra-8x -o cal.yaml"),
        ("f31v", "--published shipped on jetson-agx-orin-64gb (one fitted row)",
         "calibrate --published shipped --profile jetson-agx-orin-64gb -o cal.yaml"),
        ("f32v", "rows within 2% of the published ones", f"{PUB} <pub_noise.yaml>"),
        ("f33v", "one fitted row for three knobs (the prior keeps what it cannot fix)",
         f"{PUB} <pub_one_fit_row.yaml>"),
        ("f34v", "ms/token typed as tok/s with --accept-poor-fit (written, warned)",
         f"{PUB} <pub_ms_units.yaml> --accept-poor-fit"),
        ("f35v", "tiny-model runs with --accept-poor-fit (written, warned)",
         f"{RUNS} --accept-poor-fit"),
        ("f36", "--fit-fields an off term no row measures (it would be written at its "
         "stand-in start)", f"{PUB} shipped --fit-fields memory_efficiency,launch_overhead_s,"
         "alpha_s,memory_half_bytes"),
        ("f37v", "--fit-fields two of the default knobs, each once",
         f"{PUB} shipped --fit-fields memory_efficiency,launch_overhead_s"),
        ("f38v", "--fit-fields the M2 GPU's bandwidth cap and overhead (its shipped fit)",
         "calibrate --published shipped --profile m2-ultra-8x -o cal.yaml --fit-fields "
         "memory_bandwidth_gb_s,launch_overhead_s"),
        ("f39", "rows 100x their published speed (under the unit check's 100x of the "
         "roofline, over the hardware's peak)",
         f"{PUB} <pub_x100.yaml>"),
        ("f40", "--fit-terms with --published is refused even with --accept-poor-fit",
         f"{PUB} shipped --fit-terms memory_half_bytes --accept-poor-fit"),
    ]
    h.CASES_TABLE.extend(cases)
