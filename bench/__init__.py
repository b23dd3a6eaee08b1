"""Side-by-side benchmarks: `make bench` (python -m bench). Ratios, because absolute times drift on shared machines."""
