"""Measure this machine's CPU figures for a hwprofiles platform file.

Measures, on one core (BLAS limited to one thread):

* peak fp32 matmul FLOP/s (best of several square float32 matmuls),
* streaming DRAM read bandwidth (one pass over a large float32 array),
* disk sequential read bandwidth (a temp file written, fsync'ed, dropped from the
  page cache with posix_fadvise(POSIX_FADV_DONTNEED), then read back),
* inter-process round-trip latency and bandwidth over a multiprocessing Pipe,
* with ``--stream-host-only`` (needs torch): the host CPU work of a streamed
  layer in the executor (``executors.backend.streaming``: a direct read into an aligned
  buffer, the tensors installed as views of it), in CPU time, the
  ``stream_host_gb_s`` device field,
* with ``--widths-only`` (needs torch): fp32 matrix-product throughput on one
  core by rows per pass (the positions times rows of one Forward) over
  SmolLM2-135M's weight shapes (attention, gated MLP, LM head), relative to
  the best. Small row counts run other kernels than large ones, and not
  monotonically (below 4 rows the weights stream once per row); a diagnostic
  for passes whose time does not grow smoothly with their width,
* with ``--allreduce`` (needs torch): a gloo ``all_reduce`` over 127.0.0.1 between
  two processes pinned to the first two cores, timed at small and large message
  sizes, and ``alpha_s`` + M / bandwidth fitted to the medians in relative
  error (the platform group's ``alpha_beta`` cost with G = 2: alpha * log2(2)
  = alpha),

then prints each figure and a YAML snippet for ``hwprofiles/data/platforms``.
Runs in well under a minute with the defaults. Needs numpy only.

    python benchmarks/measure_cpu.py [--disk-mib 512] [--dir /path/on/disk] [--allreduce]
    python benchmarks/measure_cpu.py --allreduce-only
    python benchmarks/measure_cpu.py --stream-host-only [--layer-mib 13.5]
    python benchmarks/measure_cpu.py --widths-only [--max-rows 40]
"""

from __future__ import annotations

import os

# BLAS reads these when it loads, so they must be set before numpy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import multiprocessing as mp  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from contextlib import nullcontext  # noqa: E402

import numpy as np  # noqa: E402

try:  # optional: also limits a BLAS that ignores the environment variables
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover - depends on the environment
    threadpool_limits = None


def _best_s(fn, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_flops(n: int, repeats: int) -> float:
    """Peak fp32 FLOP/s of an n x n by n x n matmul on one thread."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    seconds = _best_s(lambda: np.matmul(a, b, out=out), repeats)
    return 2 * n**3 / seconds


def dram_read_gb_s(mib: int, repeats: int) -> tuple[float, float]:
    """Streaming read bandwidth: (BLAS x.x over the array, numpy sum over it)."""
    x = np.ones(mib * 2**20 // 4, dtype=np.float32)
    dot_s = _best_s(lambda: np.dot(x, x), repeats)
    sum_s = _best_s(lambda: x.sum(), repeats)
    return x.nbytes / dot_s / 1e9, x.nbytes / sum_s / 1e9


def disk_read_gb_s(directory: str, mib: int) -> float:
    """Cold sequential read bandwidth of a freshly written, uncached file."""
    chunk = bytearray(16 * 2**20)
    chunk[:] = os.urandom(len(chunk))
    fd, path = tempfile.mkstemp(prefix="measure_cpu_", dir=directory)
    try:
        for _ in range(mib // 16):
            os.write(fd, chunk)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        fd = -1
        view = memoryview(chunk)
        total = 0
        start = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
        return total / (time.perf_counter() - start) / 1e9
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(path)


def _echo(conn) -> None:
    """Child process: send every message straight back until told to stop."""
    while True:
        msg = conn.recv_bytes()
        if msg == b"stop":
            return
        conn.send_bytes(msg)


def _bulk_sink(conn, nbytes: int) -> None:
    """Child process: receive nbytes of messages, then acknowledge."""
    got = 0
    while got < nbytes:
        got += len(conn.recv_bytes())
    conn.send_bytes(b"ok")


def pipe_round_trip_s(round_trips: int) -> float:
    """Median round-trip time of a 1-byte ping-pong between two processes."""
    here, there = mp.Pipe()
    child = mp.Process(target=_echo, args=(there,))
    child.start()
    try:
        for _ in range(200):  # warm-up
            here.send_bytes(b"x")
            here.recv_bytes()
        times = np.empty(round_trips)
        for i in range(round_trips):
            start = time.perf_counter()
            here.send_bytes(b"x")
            here.recv_bytes()
            times[i] = time.perf_counter() - start
        return float(np.median(times))
    finally:
        here.send_bytes(b"stop")
        child.join()


def pipe_bandwidth_gb_s(total_mib: int, message_mib: int = 4) -> float:
    """One-way throughput of large messages over a Pipe to another process."""
    message = bytes(message_mib * 2**20)
    count = total_mib // message_mib
    here, there = mp.Pipe()
    child = mp.Process(target=_bulk_sink, args=(there, count * len(message)))
    child.start()
    start = time.perf_counter()
    for _ in range(count):
        here.send_bytes(message)
    here.recv_bytes()
    seconds = time.perf_counter() - start
    child.join()
    return count * len(message) / seconds / 1e9


def stream_host_gb_s(layer_mib: float, repeats: int, directory: str) -> tuple[float, float]:
    """(GB/s, median CPU seconds) of the host work of one streamed layer in the
    executor (``executors.backend.streaming``): the direct read of a layer file into a
    page-aligned buffer and installing its tensors as views of it. Counted in
    the thread's CPU time (``time.thread_time``), not wall time: the disk's own
    time overlaps compute, this work takes the core. The file holds layer-shaped
    fp32 tensors (attention, gated MLP, norms) of about ``layer_mib`` MiB, in the
    executor's own layout. Needs torch."""
    import torch

    from executors.backend import streaming

    torch.set_num_threads(1)
    hidden = 576  # SmolLM2-135M's shape, scaled in the MLP width to layer_mib
    ffn = max(1, int((layer_mib * 2**20 / 4 - 4 * hidden * hidden) / (3 * hidden)))
    shapes = {"q": (hidden, hidden), "k": (hidden // 3, hidden), "v": (hidden // 3, hidden),
              "o": (hidden, hidden), "gate": (ffn, hidden), "up": (ffn, hidden),
              "down": (hidden, ffn), "norm1": (hidden,), "norm2": (hidden,)}
    fd, path = tempfile.mkstemp(suffix=".safetensors", dir=directory)
    with os.fdopen(fd, "wb") as fh:
        for chunk in streaming._aligned_safetensors({k: torch.randn(v) for k, v in shapes.items()}):
            fh.write(chunk)
    size = os.path.getsize(path)
    buf = streaming.page_aligned(streaming.page_rounded(size))
    params = {k: torch.nn.Parameter(torch.empty(0)) for k in shapes}

    def install() -> float:
        start = time.thread_time()
        streaming.read_into(Path(path), buf, size)
        for name, value in streaming._tensors(buf[:size]).items():
            params[name].data = value
        return time.thread_time() - start

    try:
        install()  # warm-up
        times = [install() for _ in range(repeats)]
    finally:
        os.unlink(path)
    median_s = float(np.median(times))
    return size / median_s / 1e9, median_s


def print_stream_host(layer_mib: float, repeats: int, directory: str) -> None:
    rate, median_s = stream_host_gb_s(layer_mib, repeats, directory)
    print(f"streamed-layer host work, one core: {rate:.2f} GB/s (direct read + install "
          f"of a {layer_mib:g} MiB layer: {median_s * 1e3:.2f} ms of CPU, median of "
          f"{repeats})")
    print(f"device: {{stream_host_gb_s: {rate:.3g}}}")


# SmolLM2-135M's weight matrices (out, in): q, k, v, o, gate, up, down, LM head
WEIGHT_SHAPES = ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576),
                 (1536, 576), (576, 1536), (49152, 576))


def width_gflops(rows_list, repeats: int) -> dict[int, float]:
    """Per row count: GFLOP/s of ``F.linear`` over every weight shape of
    WEIGHT_SHAPES (one decoder layer and the LM head), one thread; the best of
    ``repeats`` timings of the whole set."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    weights = [torch.randn(shape) for shape in WEIGHT_SHAPES]
    out = {}
    for rows in rows_list:
        xs = [torch.randn(rows, w.shape[1]) for w in weights]

        def run(xs=xs):
            for x, w in zip(xs, weights):
                F.linear(x, w)
        run()
        best_s = _best_s(run, repeats)
        flops = sum(2.0 * rows * w.shape[0] * w.shape[1] for w in weights)
        out[rows] = flops / best_s / 1e9
    return out


def print_widths(max_rows: int, repeats: int) -> None:
    rows_list = sorted(set(range(1, 17)) | set(range(16, max_rows + 1, 4)) | {max_rows})
    gflops = width_gflops(rows_list, repeats)
    best = max(gflops.values())
    for rows in rows_list:
        print(f"rows {rows:3d}: {gflops[rows]:7.2f} GFLOP/s  ({gflops[rows] / best:.3f} of the best)")


ALLREDUCE_BYTES = (4, 1024, 16384, 262144, 1048576, 4194304)


def _allreduce_rank(rank: int, port: int, repeats: int, out) -> None:
    """Child process: pinned to core ``rank``; medians of timed all-reduces per size."""
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {allowed[rank % len(allowed)]})
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    medians = []
    for nbytes in ALLREDUCE_BYTES:
        buf = torch.ones(nbytes // 4, dtype=torch.float32)
        for _ in range(20):  # warm-up
            dist.all_reduce(buf)
        times = np.empty(repeats)
        for i in range(repeats):
            start = time.perf_counter()
            dist.all_reduce(buf)
            times[i] = time.perf_counter() - start
        medians.append(float(np.median(times)))
    if rank == 0:
        out.put(medians)
    dist.destroy_process_group()


def allreduce_fit(repeats: int) -> tuple[float, float, list[float]]:
    """(alpha_s, bandwidth_gb_s, median seconds per size) of a 2-process gloo
    all-reduce: least squares of t = alpha + M / bandwidth over ALLREDUCE_BYTES, in
    relative error (weights 1/t), so small messages weigh as much as large ones."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_rank, args=(r, port, repeats, out))
             for r in range(2)]
    for p in procs:
        p.start()
    medians = out.get(timeout=600)
    for p in procs:
        p.join()
    times = np.array(medians)  # relative residuals: the 4-byte time pins alpha
    slope, alpha = np.polyfit(np.array(ALLREDUCE_BYTES, dtype=float), times, 1, w=1 / times)
    return float(alpha), 1 / float(slope) / 1e9, medians


def print_allreduce(repeats: int) -> None:
    alpha_s, bw_gb_s, medians = allreduce_fit(repeats)
    for nbytes, t in zip(ALLREDUCE_BYTES, medians):
        print(f"gloo all_reduce, 2 cores, {nbytes:>8} B: {t * 1e6:9.1f} us (median of {repeats})")
    print(f"fitted t = alpha + M/bw (rel.):  alpha {alpha_s * 1e6:.1f} us, "
          f"bandwidth {bw_gb_s:.3g} GB/s")
    print(f"group: {{algorithm: alpha_beta, alpha_s: {alpha_s:.3g}, "
          f"bandwidth_gb_s: {bw_gb_s:.3g}}}")


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matmul-n", type=int, default=2048, help="matmul size (default 2048)")
    p.add_argument("--dram-mib", type=int, default=512,
                   help="array size for the DRAM read test in MiB (default 512)")
    p.add_argument("--disk-mib", type=int, default=512,
                   help="temp file size for the disk test in MiB (default 512)")
    p.add_argument("--dir", default=tempfile.gettempdir(),
                   help="directory on the disk to measure (default: the temp dir)")
    p.add_argument("--round-trips", type=int, default=5000,
                   help="pipe ping-pong round trips (default 5000)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per test")
    p.add_argument("--allreduce", action="store_true",
                   help="also time a 2-core gloo all-reduce (needs torch)")
    p.add_argument("--allreduce-only", action="store_true",
                   help="time only the 2-core gloo all-reduce")
    p.add_argument("--allreduce-repeats", type=int, default=200,
                   help="timed all-reduces per message size (default 200)")
    p.add_argument("--stream-host-only", action="store_true",
                   help="time only the host work of installing a streamed layer "
                        "(needs torch and safetensors)")
    p.add_argument("--layer-mib", type=float, default=13.5,
                   help="streamed layer size in MiB (default 13.5, SmolLM2-135M fp32)")
    p.add_argument("--widths-only", action="store_true",
                   help="only measure matrix-product throughput by rows per pass")
    p.add_argument("--max-rows", type=int, default=40,
                   help="largest rows per pass for --widths-only (default 40)")
    return p.parse_args()


def main() -> None:
    args = _parse_args()
    if args.allreduce_only:
        print_allreduce(args.allreduce_repeats)
        return
    if args.widths_only:
        allowed = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {allowed[0]})
        print_widths(args.max_rows, max(args.repeats, 7))
        return
    if args.stream_host_only:
        allowed = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {allowed[0]})  # one core, as a pinned worker
        print_stream_host(args.layer_mib, max(args.repeats, 20), args.dir)
        return
    limit = threadpool_limits(1) if threadpool_limits else nullcontext()
    with limit:
        flops = matmul_flops(args.matmul_n, args.repeats)
        dram_dot, dram_sum = dram_read_gb_s(args.dram_mib, args.repeats)
    disk = disk_read_gb_s(args.dir, args.disk_mib)
    rtt = pipe_round_trip_s(args.round_trips)
    pipe_bw = max(pipe_bandwidth_gb_s(total_mib=512) for _ in range(3))
    ram_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    disk_bytes = shutil.disk_usage(args.dir).total
    today = datetime.date.today().isoformat()

    print(f"cores (os.cpu_count):            {os.cpu_count()}")
    print(f"fp32 matmul, one core:           {flops / 1e9:.1f} GFLOP/s "
          f"(n={args.matmul_n}, best of {args.repeats})")
    print(f"DRAM streaming read, one core:   {dram_dot:.1f} GB/s (BLAS x.x); "
          f"{dram_sum:.1f} GB/s (numpy sum)")
    print(f"disk sequential read, cold:      {disk:.2f} GB/s ({args.disk_mib} MiB in {args.dir})")
    print(f"pipe round trip (1 byte):        {rtt * 1e6:.1f} us (one way {rtt / 2e-6:.1f} us)")
    print(f"pipe one-way throughput:         {pipe_bw:.2f} GB/s "
          "(best of 3 x 512 MiB in 4 MiB messages)")
    print(f"RAM capacity:                    {ram_bytes / 2**30:.1f} GiB")
    print(f"disk capacity:                   {disk_bytes / 1e9:.0f} GB")
    print()
    print(f"# YAML snippet (measured {today})")
    print(f"peak_flops: {{fp32: {flops:.4g}}}")
    print(f"dram: {{capacity_bytes: {ram_bytes:.4g}, bandwidth_gb_s: {dram_dot:.3g}}}")
    print(f"disk: {{capacity_bytes: {disk_bytes:.4g}, bandwidth_gb_s: {disk:.3g}}}")
    print(f"link: {{latency_s: {rtt / 2:.3g}, bandwidth_gb_s: {pipe_bw:.3g}}}")
    if args.allreduce:
        print()
        print_allreduce(args.allreduce_repeats)


if __name__ == "__main__":
    main()
