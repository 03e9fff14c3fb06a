"""Helpers shared by the tests (fixtures live in tests/conftest.py)."""
