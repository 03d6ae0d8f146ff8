"""Benchmarks and measuring tools, not part of the distribution. Run from the repository root:
`python -m perf_analyzer_configs.<folder>.<module>` (they import the installed triton_omni)."""
