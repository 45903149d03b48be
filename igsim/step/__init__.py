"""One simulated step: workloads, architectures, the step plan as arrays, the engine and its results."""
