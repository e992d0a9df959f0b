"""Studies: many simulated markets over a grid of settings, with verdicts per cell."""
