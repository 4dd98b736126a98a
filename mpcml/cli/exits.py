"""The exit codes of every `mpcml` command."""

from __future__ import annotations

EXIT_OK = 0
"""Success: the job completed, the daemon is SERVING, every check passed."""
EXIT_FAILED = 1
"""The job failed or was cancelled, the daemon is unhealthy or unreachable, a check failed."""
EXIT_BAD_INPUT = 2
"""Bad input: a malformed file, config or flag, or a request the coordinator refused."""
