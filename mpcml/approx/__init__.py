"""Approximations of non-linear functions under MPC: the registry, emulation, costs, bounds."""
