"""The dealer: correlated randomness for the Beaver protocol.

`server` is the daemon, `tuples` the arithmetic it shares with the parties, `provider` the
CrypTen provider the job workers use.
"""
