"""Training on real ranks: launching, the loop, its checkpoints and the watchdog."""
