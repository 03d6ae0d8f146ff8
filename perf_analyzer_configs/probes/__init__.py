"""One-off probes: kernels, host ops and syncs counted on the CPU (op_count), and single questions measured once."""
