"""Parties in other organisations: mutual TLS, the market's gateway, owner and node agents."""
