"""GPU benchmarks (and bench_front_relay, any machine); their results go through perf_analyzer_configs.results."""
