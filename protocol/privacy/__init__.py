"""Privacy bookkeeping and noise: the ledger (mechanism events, PLD / Theorem 7 / paper
accounting), the discrete Gaussian sampler, and the statistics of the empirical audit.
Imports no other protocol subpackage.
"""
