"""Robust regions: how certificates of different noise levels are kept consistent."""

from ._base import BaseAllocator
from ._none import NoRegions
from ._store import RegionStore

__all__ = ["BaseAllocator", "NoRegions", "RegionStore"]
