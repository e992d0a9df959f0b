"""Persistent budgets on the owner's side: its ledger store and the gate that charges it."""
