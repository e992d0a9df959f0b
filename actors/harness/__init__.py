"""Evaluation harnesses: in-process markets against their baselines (utility, parsimony)."""
