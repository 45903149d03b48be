"""Gradient synchronization: sparsifiers, residuals, the step-plan executor, collectives, the Synchronizer."""
