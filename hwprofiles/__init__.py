"""Hardware platforms and model specs: declarative data validated by pydantic."""

from hwprofiles.loader import (ProfileError, list_names, load_model, load_platform,
                               validate_path)
from hwprofiles.schema import (DTYPE_BYTES, CollectiveGroup, Device, Link, MemoryTier,
                               ModelSpec, Platform)

__all__ = ["CollectiveGroup", "DTYPE_BYTES", "Device", "Link", "MemoryTier", "ModelSpec",
           "Platform", "ProfileError", "list_names", "load_model", "load_platform",
           "validate_path"]
