"""DP Bayesian linear regression with projection (the DCA paper, Algorithm 2): the model, its
noisy sufficient statistics, and the fit through the secure sum. Imports wire, privacy and
securesum.
"""
