"""Benchmark harness: one timing rule, one results format, for every op."""
