"""The parties' Ray actors and what they run on: owner, curator, compute node, transports."""
