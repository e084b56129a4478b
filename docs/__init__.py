"""The documentation's examples run as doctests; this makes docs/conftest.py the module docs.conftest."""
