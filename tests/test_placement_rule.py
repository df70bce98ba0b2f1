"""One placement rule for every command (hwprofiles.schema.resolve): where the
platform places the draft with the target, a run that moves only the target moves
the draft with it; a draft placed elsewhere, or placed by the run, stays put."""

from __future__ import annotations

import json

from hwprofiles import load_platform
from hwprofiles.schema import resolve
from tests.clicases import run_cli


def test_a_draft_placed_with_the_target_follows_it():
    h200 = load_platform("h200-sxm-8x")  # target and draft on tp8
    assert h200.placement["target"] == h200.placement["draft"] == "tp8"
    assert resolve(h200, {"target": "tp2"})["draft"] == "tp2"
    assert resolve(h200, {"target": "tp2", "draft": "gpu7"})["draft"] == "gpu7"
    assert resolve(h200, {"draft": "gpu7"})["target"] == "tp8"
    assert resolve(h200)["draft"] == "tp8"


def test_a_draft_placed_apart_from_the_target_stays_put():
    five = load_platform("h100-sxm-5x")  # target on the four-GPU group, draft on gpu4
    assert five.placement["draft"] != five.placement["target"]
    assert resolve(five, {"target": "gpu0"})["draft"] == five.placement["draft"]


def test_simulate_runs_the_draft_where_fit_moves_it():
    out = run_cli("simulate", "--platform", "h200-sxm-8x", "--target", "llama-3.1-70b",
                  "--draft", "llama-3.2-1b", "--policy", "sd", "--placement", "target=tp4",
                  "--tokens", "40", "--json")
    assert out.rc == 0, out.err
    busy = json.loads(out.out)["breakdown"]["utilisation"]
    assert set(busy) == {"tp4"}  # before the rule: tp4 and tp8 (the draft on all eight)


def test_a_schedule_on_a_role_the_platform_does_not_place_is_skipped_saying_how_to_place_it(
        tmp_path):
    out = run_cli("compare", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                  "--draft", "llama-3.2-1b", "--policies", "ar,ppsd", "--tokens", "30",
                  "--jobs", "1", "--json", "-o", tmp_path / "r.html")
    assert out.rc == 0, out.err
    why = json.loads(out.out)["skipped"]["ppsd"]
    assert why == ("the schedule runs on role 'stage0', which platform h100-sxm-5x does not "
                   "place (its roles: draft, target); pass --placement stage0=gpu0 (a device "
                   "or group) or set placement.stage0 in the profile")
