"""Robust regions: how certificates of different noise levels are kept consistent."""

from ._base import BaseAllocator
from ._lp import TransductiveLPAllocator
from ._memory import MemoryAllocator
from ._none import NoRegions
from ._online import OnlineBallAllocator
from ._store import RegionStore

__all__ = [
    "BaseAllocator",
    "MemoryAllocator",
    "NoRegions",
    "OnlineBallAllocator",
    "RegionStore",
    "TransductiveLPAllocator",
]
