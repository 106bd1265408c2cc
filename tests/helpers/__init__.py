"""Helpers shared by the tests (not fixtures: those are in tests/conftest.py)."""
