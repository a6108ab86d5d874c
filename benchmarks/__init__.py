"""Throughput benchmarks; each writes its results with the machine and command to benchmarks/results/."""
