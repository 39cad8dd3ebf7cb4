"""Benchmarks: codec throughput now; collectives in later releases."""
