"""perf_analyzer inputs and runner (run.py), and the AR decode benchmark (bench_ar_decode.py)."""
