"""Hardware platforms and model specs: declarative data validated by pydantic."""

from hwprofiles.loader import (ProfileError, list_names, load_model, load_platform,
                               validate_path)
from hwprofiles.models import DTYPE_BYTES, ModelSpec
from hwprofiles.schema import CollectiveGroup, Device, Link, MemoryTier, Platform

__all__ = ["CollectiveGroup", "DTYPE_BYTES", "Device", "Link", "MemoryTier", "ModelSpec",
           "Platform", "ProfileError", "list_names", "load_model", "load_platform",
           "validate_path"]
