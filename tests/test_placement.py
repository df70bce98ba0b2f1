"""One placement resolution (hwprofiles/schema.py) for every runtime and analysis."""

import pytest

from hwprofiles import load_platform
from hwprofiles.schema import Placement, check_overrides, resolve


def test_overrides_win_over_the_platform_placement():
    platform = load_platform("h100-sxm-5x")
    assert resolve(platform) == dict(platform.placement)
    merged = resolve(platform, {"draft": "gpu0", "extra": "gpu1"})
    assert merged["draft"] == "gpu0" and merged["extra"] == "gpu1"
    assert merged["target"] == platform.placement["target"]


def test_an_override_naming_no_device_is_one_sentence():
    platform = load_platform("h100-sxm-5x")
    with pytest.raises(ValueError, match="'nowhere' is not a device or group"):
        check_overrides(platform, {"draft": "nowhere"})
    check_overrides(platform, {"draft": "gpu0"})  # a device of the platform passes


def test_resolve_is_the_one_lookup_overrides_win_and_an_unplaced_role_names_itself():
    plat = load_platform("cpu-local")
    placed = resolve(plat, {"draft": "cpu0"})
    assert isinstance(placed, Placement)
    assert placed["draft"] == "cpu0"  # the override wins over the platform's
    assert placed["target"] == plat.placement["target"]
    assert placed["cpu1"] == "cpu1" and "cpu1" not in placed  # names itself, adds nothing
    assert resolve(plat) == {**plat.placement}  # no overrides: the platform's own
