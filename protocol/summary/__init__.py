"""Private distributed summarisation (Sarpatwar et al. 2019): h1/h2 hashing, the MMD
objective, the private auction, the owner and curator parties with their state and
parameters, the release mechanisms and their plan, the final selection, the journal and
the summary message bodies. Imports only wire and privacy.
"""
