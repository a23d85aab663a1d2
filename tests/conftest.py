"""Kernel tests use the fixtures of ``buildmax.testing`` (a pytest11 plugin)."""
