"""Helpers shared by more than one test package (a conftest re-exports the fixtures)."""
