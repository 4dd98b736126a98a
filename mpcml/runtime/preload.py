"""What a job worker's fork server loads once, so that no job pays for it.

Importing torch and CrypTen took a spawned worker about 3 s of CPU for every job, and torch's
shape inference imports torch._dynamo on first use (about 1 s, in a job's first tuple).
Forking from a server that has done both shares no secret (every key comes from `os.urandom`
in the worker, after the fork) and no CUDA state (none of it initialises CUDA).
"""

from __future__ import annotations

from mpcml.runtime import compat, tuples

compat.apply()
tuples.warm()
