"""Private set intersection: the row ids a vertical job's parties share, and nothing else.

`group.py` holds the group arithmetic (libsodium through PyNaCl: ids hashed onto Curve25519 and
masked by X25519 scalar multiplication); `protocol.py` the ECDH-PSI protocol for two or more
parties over any channel that carries bytes between ranks (a job worker uses its session's data
plane, mutual TLS). No elliptic-curve arithmetic is written here.
"""
