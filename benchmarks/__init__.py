"""Benchmarks (not timed tests): each module prints a table and writes it under benchmarks/results/."""
