"""Models as graphs of whitelisted ops.

Traced from torch on the client, built into CrypTen on every party (docs/architecture.md).
"""
