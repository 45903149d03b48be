"""Traces from real training: the profiling recorder and a training run's own trace."""
