"""Admission: what a job must pass before it is stored, and who may act on a stored job.

A submitted spec is normalised (its parties, a `from_job` model's graph), validated against the
parties' public catalogues and the coordinator's limits, and vetted by every party's own policy;
a stored job belongs to its submitter (and the coordinator's admins).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Collection, Mapping

from mpcml.coordinator.registry import PartyLink
from mpcml.coordinator.store import Job, JobNotFound, JobState, JobStore
from mpcml.errors import StatusError
from mpcml.jobs.estimate import merged
from mpcml.jobs.estimate import over as estimate_over
from mpcml.jobs.spec import RoundPlan, parties_in_order
from mpcml.jobs.validate import SpecError, validate
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb
from mpcml.transport.tls import CLIENT_ROLE, PARTY_ROLE

VET_TIMEOUT_S = 10.0
"""How long a submission waits for every party's policy verdict."""

READ = "read"
"""The verb of `Admission.authorise` that a job's parties may too."""


class Admission:
    """Checks on submissions and on every call that names a job."""

    def __init__(
        self,
        store: JobStore,
        roster: Collection[str],
        max_job_rows: int | None,
        admins: Collection[str],
    ) -> None:
        self.store = store
        self.roster = list(roster)
        self.max_job_rows = max_job_rows
        self.admins = frozenset(admins)
        """Client names that may act on every job (`admins` in coordinator.toml)."""
        self._verdicts: dict[str, dict[str, cpb.Verdict]] = {}
        self._verdict_ready = threading.Condition(threading.Lock())

    # --- who may act on a job ---------------------------------------------------------------

    def job(self, job_id: str) -> Job:
        """The stored job, or NOT_FOUND."""
        try:
            return self.store.get(job_id)
        except JobNotFound as exc:
            raise StatusError("NOT_FOUND", str(exc)) from None

    def authorise(self, job_id: str, caller: str, role: str, verb: str) -> Job:
        """The job, if `caller` may `verb` it; else PERMISSION_DENIED.

        A job belongs to its submitter; admins may act on every job, and a party of a job may
        read it (`verb` READ).
        """
        job = self.job(job_id)
        if role == CLIENT_ROLE and (caller == job.submitter or caller in self.admins):
            return job
        if role == PARTY_ROLE and verb == READ:
            if caller in jpb.JobSpec.FromString(job.spec).parties:
                return job
            raise StatusError(
                "PERMISSION_DENIED", f"party {caller!r} is not a party of job {job_id}"
            )
        raise StatusError(
            "PERMISSION_DENIED",
            f"job {job_id} belongs to another submitter: only its submitter or an admin "
            f"(`admins` in coordinator.toml) may {verb} it",
        )

    def jobs_of(self, caller: str, state: JobState | None = None) -> list[Job]:
        """The jobs `caller` submitted (every job for an admin), in submission order."""
        jobs = self.store.jobs(state)
        return jobs if caller in self.admins else [j for j in jobs if j.submitter == caller]

    # --- a submission -----------------------------------------------------------------------

    def normalise(self, spec: jpb.JobSpec, submitter: str) -> jpb.JobSpec:
        """The spec as it is stored: split and parties filled in, a `from_job` model's graph."""
        spec = jpb.JobSpec.FromString(spec.SerializeToString())
        if spec.split == jpb.SPLIT_UNSPECIFIED and len(spec.features) <= 1:
            spec.split = jpb.SPLIT_VERTICAL
        if spec.weights.WhichOneof("source") != "from_job":
            if not spec.parties:
                spec.parties.extend(parties_in_order(spec))
            return spec
        source = self.authorise(spec.weights.from_job, submitter, CLIENT_ROLE, "use the model of")
        trained = jpb.JobSpec.FromString(source.spec)
        if source.state != JobState.COMPLETED or trained.task != jpb.TASK_TRAIN:
            raise StatusError(
                "FAILED_PRECONDITION",
                f"job {source.job_id} is a {jpb.Task.Name(trained.task)} job in state "
                f"{source.state}; only a COMPLETED train job leaves a model to use",
            )
        if not spec.graph.nodes:
            spec.graph.CopyFrom(trained.graph)
        elif spec.graph != trained.graph:
            raise StatusError(
                "INVALID_ARGUMENT", f"the job's graph differs from job {source.job_id}'s model"
            )
        if spec.parties and list(spec.parties) != list(trained.parties):
            raise StatusError(
                "INVALID_ARGUMENT",
                f"job {source.job_id}'s model is shared among {list(trained.parties)} in "
                f"that order; this job names {list(spec.parties)}",
            )
        mine = set(parties_in_order(spec)) - set(trained.parties)
        if mine:
            raise StatusError(
                "INVALID_ARGUMENT",
                f"parties {sorted(mine)} hold no shares of job {source.job_id}'s model "
                f"(shared among {list(trained.parties)})",
            )
        del spec.parties[:]
        spec.parties.extend(trained.parties)
        return spec

    def check(self, spec: jpb.JobSpec, parties: Mapping[str, cpb.AttachRequest]) -> RoundPlan:
        """Validate a normalised spec against the attached parties and the limits."""
        try:
            plan = validate(spec, parties, self.roster)
        except SpecError as exc:
            raise StatusError(
                "FAILED_PRECONDITION" if exc.precondition else "INVALID_ARGUMENT", str(exc)
            ) from None
        rows = plan.rows * plan.epochs
        if self.max_job_rows is not None and rows > self.max_job_rows:
            raise StatusError(
                "RESOURCE_EXHAUSTED",
                f"the job passes {rows} rows through its model ({plan.rows} rows x "
                f"{plan.epochs} epochs), over the coordinator's limit max_job_rows = "
                f"{self.max_job_rows}",
            )
        return plan

    def vet(
        self,
        spec: jpb.JobSpec,
        submitter: str,
        links: Mapping[str, PartyLink],
        rows: tuple[list[int], list[int]],
    ) -> cpb.ResourceEstimate:
        """Ask every party of the job whether its policy allows it; waits without the lock.

        `rows` (each binding's registered rows) let a party count how many of its rows each
        revealed aggregate covers. Each party answers with its own estimate of the job's cost;
        one over a party's registered limits is RESOURCE_EXHAUSTED. Returns the estimates,
        merged.
        """
        request_id = uuid.uuid4().hex
        with self._verdict_ready:
            self._verdicts[request_id] = {}
        vet = cpb.VetJob(
            request_id=request_id,
            spec=spec,
            submitter=submitter,
            feature_rows=rows[0],
            label_rows=rows[1],
        )
        for link in links.values():
            link.send(cpb.Assignment(vet=vet))
        deadline = time.monotonic() + VET_TIMEOUT_S
        with self._verdict_ready:
            while len(self._verdicts[request_id]) < len(links):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._verdict_ready.wait(left)
            verdicts = self._verdicts.pop(request_id)
        for name in links:
            verdict = verdicts.get(name)
            if verdict is None:
                raise StatusError(
                    "FAILED_PRECONDITION",
                    f"party {name!r} did not answer the policy check within {VET_TIMEOUT_S:.0f} s",
                )
            if verdict.over_limit:
                raise StatusError("RESOURCE_EXHAUSTED", f"the job is over {verdict.reason}")
            if not verdict.allowed:
                raise StatusError(
                    "PERMISSION_DENIED", f"party {name!r} refuses the job: {verdict.reason}"
                )
        found = merged({n: verdicts[n].estimate for n in links})
        for name, link in links.items():
            over = estimate_over(found, name, link.info.limits)
            if over:
                raise StatusError("RESOURCE_EXHAUSTED", f"the job is over {'; '.join(over)}")
        return found

    def verdict(self, party: str, verdict: cpb.Verdict) -> None:
        """A party's answer to a policy check."""
        with self._verdict_ready:
            pending = self._verdicts.get(verdict.request_id)
            if pending is None:
                raise StatusError("FAILED_PRECONDITION", "no policy check is waiting for it")
            pending[party] = verdict
            self._verdict_ready.notify_all()
