"""Reaching Ray: connecting to a cluster, shipping the code, placing owners on their nodes."""
