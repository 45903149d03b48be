"""Studies built on the engine: sweeps, validation against testbeds, replays of real runs."""
