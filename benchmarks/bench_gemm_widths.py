"""How a CPU GEMM's time moves with its rows: the evidence for a multi-row factor
by width (``Device.multirow_memory_factor`` as a table; ``hetspec calibrate
--fit-terms multirow_by_rows``).

    python benchmarks/bench_gemm_widths.py [--threads 1] [--repeats 5]

Times ``torch.nn.functional.linear`` of M rows against SmolLM2-135M's weight
shapes (an attention projection, the MLP's up and down projections, the
49,152 x 576 LM head) for M = 1..32 on the torch threads given, the widths
interleaved over ``--repeats`` rounds, and prints each width's median time over
the one-row time. The layer matrices (1-3.5 MB) stay in cache across calls, so
their ratios show the GEMM kernels' compute; the LM head (113 MB in fp32)
streams from DRAM like a whole model's pass does. Neither grows smoothly with
M: a one-row product is a GEMV, wider ones run GEMM kernels that block rows, so
2 and 3 rows can cost more than 4. A pass's cost at the widths a schedule runs
is measured, not interpolated from one factor.

The last column is the rows a device with ``gemm_row_tiles`` computes a pass as
(``Device.compute_rows``; ``--profile``, default cpu-local's [4, 2, 1]): the
rows covered greedily by tiles of 4, 2 and 1, each computing as 4. Where the
cached layer matrices' times step with it (5-8 rows alike, 7 like 9-10, 11 like
13, 15 like 17), the tiles are this CPU's; the simulator and calibration bill a
pass's FLOPs on those rows.
"""

from __future__ import annotations

import argparse
import statistics
import time

SHAPES = {"q_proj": (576, 576), "up_proj": (1536, 576), "down_proj": (576, 1536),
          "lm_head": (49152, 576)}
WIDTHS = tuple(range(1, 22)) + (24, 32)


def time_linear(torch, x, w, calls: int) -> float:
    torch.nn.functional.linear(x, w)  # warm
    start = time.perf_counter()
    for _ in range(calls):
        torch.nn.functional.linear(x, w)
    return (time.perf_counter() - start) / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--profile", default="cpu-local",
                    help="platform whose first device's gemm_row_tiles the last column "
                         "applies (default cpu-local)")
    args = ap.parse_args(argv)
    import torch

    from hwprofiles import load_platform

    device = load_platform(args.profile).devices[0]

    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    weights = {k: torch.randn(*s, generator=gen) for k, s in SHAPES.items()}
    inputs = {(k, m): torch.randn(m, w.shape[1], generator=gen)
              for k, w in weights.items() for m in WIDTHS}
    times = {key: [] for key in inputs}
    for _ in range(args.repeats):
        for m in WIDTHS:
            for k, w in weights.items():
                calls = 5 if k == "lm_head" else 40
                times[k, m].append(time_linear(torch, inputs[k, m], w, calls))
    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats} "
          f"interleaved rounds; time at M rows / time at 1 row")
    tiles = list(device.gemm_row_tiles or []) or "none"
    print("| rows | " + " | ".join(SHAPES) + f" | computes as (tiles {tiles}) |")
    print("|---:|" + "---:|" * (len(SHAPES) + 1))
    for m in WIDTHS:
        print(f"| {m} | " + " | ".join(f"{med[k, m] / med[k, 1]:.2f}" for k in SHAPES)
              + f" | {device.compute_rows(m)} |")
    print("| 1 row (us) | " + " | ".join(f"{med[k, 1] * 1e6:.0f}" for k in SHAPES) + " | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
