"""Real simulation kernels used by the example regression suite, the tests and the benchmarks."""
