"""Closed-form laws against the papers' published figures."""

import math

import pytest

from hwprofiles import schema
from policies import sd, ssdplan
from policies.cats import cats_law, kangaroo_law
from policies.mirror import mirror_law
from policies.ppsd import ppsd_law
from policies.sd import leviathan
from policies.ssd import ssd_law

# Leviathan et al. 2023, table (c = c_hat = 0): (alpha, gamma) -> (speed, operations)
LEVIATHAN_TABLE = [
    (0.6, 2, 1.96, 1.53), (0.7, 3, 2.53, 1.58), (0.8, 2, 2.44, 1.23),
    (0.8, 5, 3.69, 1.63), (0.9, 2, 2.71, 1.11), (0.9, 10, 6.86, 1.60),
]


@pytest.mark.parametrize("alpha,gamma,speed,ops", LEVIATHAN_TABLE)
def test_leviathan_table_to_two_decimals(alpha, gamma, speed, ops):
    out = leviathan(alpha, gamma, c=0)
    assert round(out["speedup"], 2) == speed
    assert round(out["operations_factor"], 2) == ops


def test_leviathan_expected_tokens_and_cost_ratio():
    out = leviathan(0.8, 5, c=0.1)
    expected = (1 - 0.8 ** 6) / 0.2
    assert out["expected_tokens_per_step"] == pytest.approx(expected, rel=1e-12)
    assert out["speedup"] == pytest.approx(expected / 1.5, rel=1e-12)
    assert leviathan(1.0, 4)["expected_tokens_per_step"] == 5


def test_mirror_piecewise_on_both_sides_of_the_knee():
    hidden = mirror_law(0.010, 0.010, 0.006, t_rv_s=0.0001)
    assert hidden["step_latency_s"] == pytest.approx(0.0201)
    assert hidden["speedup_vs_sd"] == pytest.approx(0.026 / 0.0201)
    assert hidden["draft_hidden"] and hidden["mirror_wins"]
    exposed = mirror_law(0.010, 0.004, 0.006, t_rv_s=0.0001)
    assert exposed["step_latency_s"] == pytest.approx(0.010 + 0.006 + 0.0001)
    assert exposed["speedup_vs_sd"] == pytest.approx(0.020 / 0.0161)
    assert not exposed["draft_hidden"]


def test_ssd_speedup_formula_and_batch():
    out = ssd_law(0.88, 5.7, 4.0, 0.8, 0.8, batch=1)
    assert out["speedup"] == pytest.approx((0.88 * 5.7 + 0.12 * 4.0) / (0.88 + 0.12 * 1.8))
    b4 = ssd_law(0.88, 5.7, 4.0, 0.8, 0.8, batch=4)
    assert b4["all_hit_rate"] == pytest.approx(0.88 ** 4)
    assert b4["speedup"] < out["speedup"]
    # per row: the rows that hit keep their speculation, so the tokens stay those
    # of the per-row rate while the round waits for a backup unless all rows hit
    assert b4["tokens_per_round"] == pytest.approx(out["tokens_per_round"])
    p_all = 0.88 ** 4
    assert b4["speedup"] == pytest.approx((0.88 * 5.7 + 0.12 * 4.0)
                                          / (p_all * 1 + (1 - p_all) * 1.8))


def test_ssd_law_of_the_issue_is_the_per_row_form():
    """p = 0.9, E_hit = 5.5, E_miss = 4.5, T_p = T_b = 0.7, B = 8: 3.86, where
    taking every row's speculation from the backup on a miss gave 3.53."""
    out = ssd_law(0.9, 5.5, 4.5, 0.7, 0.7, batch=8)
    assert round(out["speedup"], 2) == 3.86


def test_ssd_geometric_fanout_shape():
    f = [4.0 * w for w in ssdplan.geometric_fanout_shape(0.8, 0.5, 3)]
    assert f[:3] == pytest.approx([4.0 * 0.8 ** (k / 1.5) for k in range(3)])
    assert f[3] == pytest.approx(4.0 * 0.8 ** (3 / 1.5) * 0.2 ** (-1 / 1.5))
    assert ssdplan.miss_rate(4.0, 0.5) == pytest.approx(0.5)
    assert ssdplan.miss_rate(0.5, 0.5) == 1.0 and ssdplan.miss_rate(0, 0.5) == 1.0


def test_ppsd_paper_example_and_eesd():
    assert round(ppsd_law(32, 8, 0.3226)["speedup"], 2) == 1.32
    out = ppsd_law(32, 8, 0.6738, gamma=5)
    tokens = (1 - 0.6738 ** 6) / (1 - 0.6738)
    assert out["eesd_speedup"] == pytest.approx(tokens * 32 / (5 * 8 + 32))
    assert out["lambda"] == pytest.approx(out["speedup"] / out["eesd_speedup"])
    assert ppsd_law(32, 8, 1.0)["speedup"] == pytest.approx(32 / 8)


def test_cats_and_kangaroo_bytes_per_token():
    cats = cats_law(0.4048, 32, 5, 3, 3.05, l_sv=15)["bytes_per_token_gb"]
    kang = kangaroo_law(0.4048, 32, 5, 3, 2.27)["bytes_per_token_gb"]
    assert cats == pytest.approx(5.84, rel=0.01)
    assert kang == pytest.approx(8.37, rel=0.01)


def test_alpha_beta_allreduce():
    assert schema.allreduce_s("alpha_beta", 14e-6, 236e9, 4, 1e6) == pytest.approx(
        28e-6 + 1e6 / 236e9)
    assert math.isclose(schema.allreduce_s("alpha_beta", 1e-5, 1e9, 1, 1e6), 0.0)
    assert schema.allreduce_s("ring", 1e-6, 1e9, 4, 4e6) == pytest.approx(
        6e-6 + 1.5 * 4e6 / 1e9)
    assert schema.allreduce_s("tree", 1e-6, 1e9, 4, 4e6) == pytest.approx(
        4 * (1e-6 + 4e6 / 1e9))


def test_expected_accepted_is_the_geometric_sum():
    assert sd.expected_accepted(0.8, 3) == pytest.approx(0.8 + 0.64 + 0.512)
    assert sd.expected_tokens(0.7, 4) == pytest.approx((1 - 0.7 ** 5) / 0.3)
    assert sd.expected_tokens(1.0, 4) == 5.0


@pytest.mark.parametrize("bad", [dict(alpha=1.5, gamma=3), dict(alpha=0.5, gamma=0)])
def test_bad_law_parameters_raise_one_sentence(bad):
    with pytest.raises(ValueError, match="must"):
        leviathan(**bad)
