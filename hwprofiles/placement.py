"""Which device or group plays each role of a schedule (``target``, ``draft``,
``stage0``, ...): the platform's default placement with a run's overrides on
top. Every runtime and analysis resolves a run's placement here, once.
"""

from __future__ import annotations

from hwprofiles.schema import Platform


class Placement(dict):
    """{role: device or group}. A role placed nowhere names a device or group
    itself, so ``placement[role]`` is the one lookup every reader uses."""

    def __missing__(self, role: str) -> str:
        return role


def check_overrides(platform: Platform, overrides: dict[str, str]) -> None:
    """Raise ValueError when an override names no device or group of the platform."""
    names = [d.name for d in platform.devices] + [g.name for g in platform.groups]
    for role, where in overrides.items():
        if not role.strip():
            raise ValueError(f"placement '={where}' has no role; write ROLE=DEVICE, "
                             "e.g. draft=gpu4")
        if where not in names:
            raise ValueError(f"placement {role}={where}: '{where}' is not a device or "
                             f"group of platform {platform.name}; use one of "
                             f"{', '.join(names)}")


def resolve(platform: Platform, overrides: dict[str, str] | None = None) -> Placement:
    """The platform's placement, a run's overrides winning."""
    return Placement({**platform.placement, **(overrides or {})})

