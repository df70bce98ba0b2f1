"""Which device or group plays each role of a schedule (``target``, ``draft``,
``stage0``, ...): the platform's default placement with a run's overrides on
top. Every runtime and analysis resolves a run's placement here, once.
"""

from __future__ import annotations

from hwprofiles.schema import Platform


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


def resolve(platform: Platform, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """{role: device or group}: the platform's placement, a run's overrides winning.
    A role placed nowhere names a device or group itself."""
    return {**platform.placement, **(overrides or {})}

