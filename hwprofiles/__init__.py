"""Hardware platforms, model specs and software stacks: declarative data validated
by pydantic."""

from hwprofiles.loader import (ProfileError, list_names, load_model, load_platform,
                               load_stack, validate_path)
from hwprofiles.models import DTYPE_BYTES, ModelSpec
from hwprofiles.schema import CollectiveGroup, Device, Link, MemoryTier, Platform
from hwprofiles.stacks import DEFAULT_STACK, Stack

__all__ = ["CollectiveGroup", "DEFAULT_STACK", "DTYPE_BYTES", "Device", "Link",
           "MemoryTier", "ModelSpec", "Platform", "ProfileError", "Stack", "list_names", "load_model",
           "load_platform", "load_stack", "validate_path"]
