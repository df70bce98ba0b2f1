"""Messages between worker processes travel on the link's time: a Transfer never
waits behind compute queued on either end, a Forward that reads received hidden
states still waits for them, and SSD's verdict reaches the draft while it
pre-speculates, so a miss stops the pre-speculation after the step in flight.
Tiny random models, worker processes."""

from __future__ import annotations

import time
from multiprocessing.connection import wait

import pytest

from tests.needs import needs_torch

needs_torch()  # before the imports that load torch

from executors.backend.device import FwdCmd
from executors.coordinate.loop import call
from executors.session import Options, Session
from executors.backend.workers import LoadCmd, WorkerClient
from policies.runs.measured import MeasuredSpan
from policies.ssd import PRESPEC, TO_DRAFT, TO_TARGET
from tests.hangguard import HANG_S

PROMPT = [5, 9, 14, 3, 7, 22, 1]
REPLY_TIMEOUT_S = HANG_S  # a hang guard (tests/hangguard.py)


def spec(tmp_path, name: str, layers: int, hidden: int) -> str:
    """A random model spec (vocabulary shared by target and draft)."""
    fields = {"n_layers": layers, "hidden": hidden, "ffn": 2 * hidden, "n_heads": 4,
              "n_kv_heads": 2, "head_dim": hidden // 4, "vocab": 48}
    lines = [f"name: {name}", *(f"{k}: {v}" for k, v in fields.items()), "dtype: fp32",
             "hf_architecture: LlamaForCausalLM", "sources:"]
    lines += [f"  {k}: test fixture" for k in fields]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _await(clients: dict, wanted: set[int]) -> dict[int, tuple]:
    """Replies to the tickets ``wanted``, or fail once none came for a long while."""
    got: dict[int, tuple] = {}
    conns = {c.connection(): c for c in clients.values()}
    while wanted - set(got):
        ready = wait(list(conns), timeout=REPLY_TIMEOUT_S)
        assert ready, f"no reply to tickets {sorted(wanted - set(got))}"
        for conn in ready:
            got.update(conns[conn].replies())
    return got


@pytest.fixture(scope="module")
def three_workers(tmp_path_factory):
    """Workers cpu:0 and cpu:1 holding a tiny target, and cpu:2 (sharing a core
    with cpu:0 on a 2-core machine) that only sends. Started once for the module:
    each test below names handles of its own, so neither sees states the other
    sent, whichever runs first."""
    source = f"random:{spec(tmp_path_factory.mktemp('workers'), 'tiny', 6, 64)}"
    clients = WorkerClient.start_all(["cpu:0", "cpu:1", "cpu:2"])
    try:
        call(clients, [(name, LoadCmd({"target": source}, 0, source))
                       for name in ("cpu:0", "cpu:1")])
        yield clients
    finally:
        for client in clients.values():
            client.close()


def test_a_message_overtakes_a_forward_that_waits_for_its_own_data(three_workers):
    """cpu:1 queues a Forward reading hidden states from cpu:0 whose send is held
    back; a message from cpu:2 sent meanwhile arrives while that Forward still
    waits (its reply cannot come: its data was never sent). Only then are the
    states sent: the Forward starts after they were sent and ends after the
    message."""
    clients = three_workers
    a, b, c = clients["cpu:0"], clients["cpu:1"], clients["cpu:2"]
    n = len(PROMPT)
    call(clients, [("cpu:0", FwdCmd(1, "target", (0, 3), [0], [n], [PROMPT]))])
    (_, send_h), (_, recv_h) = b.fetch_commands(a, "cpu:0", 1)
    (_, send_m), (_, recv_m) = b.message_commands(c, "cpu:2", 64.0)
    b.submit(10, recv_h)
    b.submit(11, FwdCmd(2, "target", (3, 6), [0], [n], inputs=1))
    c.submit(12, send_m)
    b.submit(13, recv_m)
    message = _await(clients, {12, 13})
    assert not b.has_replies()  # the Forward still waits for its states
    a.submit(14, send_h)
    rest = _await(clients, {10, 11, 14})
    forward, sent = rest[11], rest[14]
    assert isinstance(forward[0], dict) and rest[10][0] is None
    assert message[13][2] < forward[2]  # the message did not queue behind the Forward
    assert forward[1] >= sent[1]  # the Forward waited for its states


def test_messages_between_two_workers_end_in_the_order_sent(three_workers):
    """A link delivers in order: hidden states and a message from cpu:0 to cpu:1,
    sent in that order, answer in that order (the coordinator's bookkeeping of
    pipeline stages relies on it)."""
    clients = three_workers
    a, b = clients["cpu:0"], clients["cpu:1"]
    call(clients, [("cpu:0", FwdCmd(3, "target", (0, 3), [0], [4], [PROMPT[:4]]))])
    for i in range(6):
        pairs = b.fetch_commands(a, "cpu:0", 3) if i == 0 else \
            b.message_commands(a, "cpu:0", 16.0 * i)
        a.submit(100 + 2 * i, pairs[0][1])
        b.submit(101 + 2 * i, pairs[1][1])
    got = _await(clients, {100 + j for j in range(12)})
    received = sorted((got[101 + 2 * i][2], i) for i in range(6))
    order = [i for _, i in received]
    assert order == list(range(6))


def _rounds(spans: list[MeasuredSpan]):
    """Per round: (verdict to draft span, pre-speculation passes of the round). A
    round's passes start between the trips of its own speculation to the target
    and of the next one."""
    sent = sorted(x.end_s for x in spans if x.name == TO_TARGET)
    verdicts = sorted((x for x in spans if x.name == TO_DRAFT), key=lambda x: x.end_s)
    passes = [x for x in spans if x.name == PRESPEC]
    rounds = []
    for verdict in verdicts:
        lo = max(t for t in sent if t < verdict.start_s)
        hi = min((t for t in sent if t > verdict.end_s), default=float("inf"))
        rounds.append((verdict, sorted((p for p in passes if lo <= p.start_s < hi),
                                       key=lambda p: p.start_s)))
    return rounds


@pytest.fixture(scope="module")
def ssd_runs(tmp_path_factory):
    """AR and SSD (K=3, 16 guesses per outcome: 64 rows per pre-speculation pass on
    a draft much wider than the 2-layer target) in worker processes."""
    tmp = tmp_path_factory.mktemp("ssd")
    target, draft = spec(tmp, "target", 2, 64), spec(tmp, "draft", 8, 512)
    with Session("cpu-local", f"random:{target}", f"random:{draft}",
                 options=Options(max_new_tokens=16, mode="processes")) as s:
        ar = s.decode("ar", {}, [PROMPT])
        ssd = s.decode("ssd", {"k": 3, "fanout": 16, "hit_rate": 0.5}, [PROMPT])
    return ar, ssd


def test_ssd_in_worker_processes_is_lossless(ssd_runs):
    ar, ssd = ssd_runs
    assert ssd.generated[0][:16] == ar.generated[0][:16]


def test_a_miss_stops_the_pre_speculation_after_the_step_in_flight(ssd_runs):
    """The cache decision needs the first pre-speculation pass (its bonus-token
    guesses); the verdict then reaches the draft while the next pass runs (the
    message does not wait for it), and the draft stops after that pass: in a missed
    round every pass but the last ended before the verdict arrived, the last ended
    after, and fewer than K passes ran."""
    _, ssd = ssd_runs
    held = [line["held"][0] for line in ssd.acceptance if line.get("event") == "cache_hit"]
    rounds = _rounds(ssd.spans)
    assert len(rounds) == len(held)
    missed = [r for r, h in zip(rounds, held) if not h]
    assert missed, "random models should miss the cache"
    for verdict, passes in missed:
        assert 0 < len(passes) < 3
        assert all(p.end_s < verdict.end_s for p in passes[:-1])
        assert passes[-1].end_s > verdict.end_s
