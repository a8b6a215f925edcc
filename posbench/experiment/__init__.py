"""Running experiments: sweep configuration, training, evaluation, profiling, one run computed in
any process, executors and the sweep runner."""
