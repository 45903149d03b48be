"""Collectives: message schedules, closed forms, gloo's real algorithms, predictions and the engine's cost cache."""
