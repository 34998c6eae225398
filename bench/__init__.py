"""Benchmarks: every performance figure of the project. ``python -m bench`` lists them."""
