"""The DCA secure sum (Heikkila et al. 2017): fixed-point ring encoding, sealing and pair keys,
derived blinding masks, the session spec and message bodies, client, compute node and
aggregator parties, and an in-process driver. Imports only wire and privacy.
"""
