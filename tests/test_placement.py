"""One placement resolution (hwprofiles/placement.py) for every runtime and analysis."""

import pytest

from hwprofiles import load_platform
from hwprofiles.placement import check_overrides, resolve


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
