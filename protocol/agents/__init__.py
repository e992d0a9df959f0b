"""Control frames between the market and remote agents, and an owner's acceptance policy."""
