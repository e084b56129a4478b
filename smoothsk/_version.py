"""The library's version, below every module that records it (saved models, checkpoints)."""

__version__ = "0.1.0"
