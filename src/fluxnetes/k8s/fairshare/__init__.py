"""Accounts and fair share: FluxAccounts read from the cluster, and what each account is
charged for what its groups hold."""
