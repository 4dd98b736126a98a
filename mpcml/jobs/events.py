"""The kinds of a job's events, one vocabulary for the coordinator and its clients.

The coordinator stores and streams them (`JobEvent.kind`); clients read them, and ignore a kind
they do not know.
"""

from __future__ import annotations

from enum import StrEnum


class EventKind(StrEnum):
    """What happened to a job."""

    SUBMITTED = "submitted"
    """Accepted: its parties and total rounds."""
    STATE = "state"
    """The job entered a state (`state`), with a reason on failure."""
    ROUND_STARTED = "round_started"
    """GO for a round went to every party."""
    ROUND_DONE = "round_done"
    """A round is committed: every party reported it, with public metrics and digests."""
    PARTY_READY = "party_ready"
    """A party's worker is up with its data loaded."""
    PARTY_FINISHED = "party_finished"
    """A party's worker finished: its outputs and traffic."""
    RESUMED = "resumed"
    """A FAILED job was queued again, from a committed round."""
    FINAL_METRICS = "final_metrics"
    """An evaluate job's public metrics."""
