"""Summaries of traces: the AR engine's step trace and Triton's own."""
