"""Benchmarks run by `aioworker bench`; each prints its baseline beside it, from the same run."""
