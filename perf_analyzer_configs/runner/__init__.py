"""perf_analyzer against the served models: the runner (run.py), the binary (perf_analyzer.py) and
its input data (inputs.py, inputs/)."""
