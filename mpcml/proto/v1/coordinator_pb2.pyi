from mpcml.proto.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    PENDING: _ClassVar[JobState]
    STARTING: _ClassVar[JobState]
    RUNNING: _ClassVar[JobState]
    COMPLETED: _ClassVar[JobState]
    FAILED: _ClassVar[JobState]
    CANCELLED: _ClassVar[JobState]
JOB_STATE_UNSPECIFIED: JobState
PENDING: JobState
STARTING: JobState
RUNNING: JobState
COMPLETED: JobState
FAILED: JobState
CANCELLED: JobState

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec", "idempotency_key")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    spec: _job_pb2.JobSpec
    idempotency_key: str
    def __init__(self, spec: _Optional[_Union[_job_pb2.JobSpec, _Mapping]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: JobState
    def __init__(self, state: _Optional[_Union[JobState, str]] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id", "after_seq")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    after_seq: int
    def __init__(self, job_id: _Optional[str] = ..., after_seq: _Optional[int] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PurgeJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class PurgeJobResponse(_message.Message):
    __slots__ = ("parties", "absent")
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    ABSENT_FIELD_NUMBER: _ClassVar[int]
    parties: _containers.RepeatedScalarFieldContainer[str]
    absent: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, parties: _Optional[_Iterable[str]] = ..., absent: _Optional[_Iterable[str]] = ...) -> None: ...

class ResumeJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetResultRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListPartiesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPartiesResponse(_message.Message):
    __slots__ = ("parties",)
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    parties: _containers.RepeatedCompositeFieldContainer[PartyStatus]
    def __init__(self, parties: _Optional[_Iterable[_Union[PartyStatus, _Mapping]]] = ...) -> None: ...

class PartyStatus(_message.Message):
    __slots__ = ("name", "data_address", "device", "connected", "heartbeat_age", "datasets", "models", "model_info", "limits")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_FIELD_NUMBER: _ClassVar[int]
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    MODEL_INFO_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    name: str
    data_address: str
    device: str
    connected: bool
    heartbeat_age: float
    datasets: _containers.RepeatedCompositeFieldContainer[DatasetInfo]
    models: _containers.RepeatedScalarFieldContainer[str]
    model_info: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    limits: ResourceLimits
    def __init__(self, name: _Optional[str] = ..., data_address: _Optional[str] = ..., device: _Optional[str] = ..., connected: _Optional[bool] = ..., heartbeat_age: _Optional[float] = ..., datasets: _Optional[_Iterable[_Union[DatasetInfo, _Mapping]]] = ..., models: _Optional[_Iterable[str]] = ..., model_info: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., limits: _Optional[_Union[ResourceLimits, _Mapping]] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job_id", "name", "state", "reason", "current_round", "total_rounds", "state_times", "submitter", "task", "parties", "metrics", "idempotency_key", "warnings", "committed_round", "resumes", "graph_digest", "approximations", "rows", "estimate")
    class StateTimesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    STATE_TIMES_FIELD_NUMBER: _ClassVar[int]
    SUBMITTER_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_ROUND_FIELD_NUMBER: _ClassVar[int]
    RESUMES_FIELD_NUMBER: _ClassVar[int]
    GRAPH_DIGEST_FIELD_NUMBER: _ClassVar[int]
    APPROXIMATIONS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    state: JobState
    reason: str
    current_round: int
    total_rounds: int
    state_times: _containers.ScalarMap[str, float]
    submitter: str
    task: _job_pb2.Task
    parties: _containers.RepeatedScalarFieldContainer[str]
    metrics: _containers.ScalarMap[str, float]
    idempotency_key: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    committed_round: int
    resumes: int
    graph_digest: str
    approximations: _job_pb2.ApproximationPlan
    rows: int
    estimate: ResourceEstimate
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., reason: _Optional[str] = ..., current_round: _Optional[int] = ..., total_rounds: _Optional[int] = ..., state_times: _Optional[_Mapping[str, float]] = ..., submitter: _Optional[str] = ..., task: _Optional[_Union[_job_pb2.Task, str]] = ..., parties: _Optional[_Iterable[str]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., idempotency_key: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ..., committed_round: _Optional[int] = ..., resumes: _Optional[int] = ..., graph_digest: _Optional[str] = ..., approximations: _Optional[_Union[_job_pb2.ApproximationPlan, _Mapping]] = ..., rows: _Optional[int] = ..., estimate: _Optional[_Union[ResourceEstimate, _Mapping]] = ...) -> None: ...

class ResourceEstimate(_message.Message):
    __slots__ = ("peak_memory_bytes", "memory", "parameters", "tuple_elements", "bytes_per_batch", "rounds_per_batch", "batches")
    class PeakMemoryBytesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class MemoryEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    TUPLE_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_BATCH_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_PER_BATCH_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    peak_memory_bytes: _containers.ScalarMap[str, int]
    memory: _containers.ScalarMap[str, int]
    parameters: int
    tuple_elements: int
    bytes_per_batch: int
    rounds_per_batch: int
    batches: int
    def __init__(self, peak_memory_bytes: _Optional[_Mapping[str, int]] = ..., memory: _Optional[_Mapping[str, int]] = ..., parameters: _Optional[int] = ..., tuple_elements: _Optional[int] = ..., bytes_per_batch: _Optional[int] = ..., rounds_per_batch: _Optional[int] = ..., batches: _Optional[int] = ...) -> None: ...

class ResourceLimits(_message.Message):
    __slots__ = ("max_job_memory_bytes", "max_parameters", "max_tuple_elements", "max_job_seconds")
    MAX_JOB_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    MAX_TUPLE_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    MAX_JOB_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_job_memory_bytes: int
    max_parameters: int
    max_tuple_elements: int
    max_job_seconds: float
    def __init__(self, max_job_memory_bytes: _Optional[int] = ..., max_parameters: _Optional[int] = ..., max_tuple_elements: _Optional[int] = ..., max_job_seconds: _Optional[float] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("seq", "at", "kind", "round", "state", "metrics", "message", "total_rounds")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    at: float
    kind: str
    round: int
    state: JobState
    metrics: _containers.ScalarMap[str, float]
    message: str
    total_rounds: int
    def __init__(self, seq: _Optional[int] = ..., at: _Optional[float] = ..., kind: _Optional[str] = ..., round: _Optional[int] = ..., state: _Optional[_Union[JobState, str]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., message: _Optional[str] = ..., total_rounds: _Optional[int] = ...) -> None: ...

class JobResult(_message.Message):
    __slots__ = ("status", "outputs", "rounds", "bytes_sent", "communication_rounds", "seconds", "profile", "first_batch_seconds", "median_batch_seconds", "peak_memory_bytes", "devices")
    class PeakMemoryBytesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DevicesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    COMMUNICATION_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    FIRST_BATCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_BATCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    status: JobStatus
    outputs: _containers.RepeatedCompositeFieldContainer[PartyOutput]
    rounds: _containers.RepeatedCompositeFieldContainer[RoundMetrics]
    bytes_sent: int
    communication_rounds: int
    seconds: float
    profile: _containers.RepeatedCompositeFieldContainer[NodeCost]
    first_batch_seconds: float
    median_batch_seconds: float
    peak_memory_bytes: _containers.ScalarMap[str, int]
    devices: _containers.ScalarMap[str, str]
    def __init__(self, status: _Optional[_Union[JobStatus, _Mapping]] = ..., outputs: _Optional[_Iterable[_Union[PartyOutput, _Mapping]]] = ..., rounds: _Optional[_Iterable[_Union[RoundMetrics, _Mapping]]] = ..., bytes_sent: _Optional[int] = ..., communication_rounds: _Optional[int] = ..., seconds: _Optional[float] = ..., profile: _Optional[_Iterable[_Union[NodeCost, _Mapping]]] = ..., first_batch_seconds: _Optional[float] = ..., median_batch_seconds: _Optional[float] = ..., peak_memory_bytes: _Optional[_Mapping[str, int]] = ..., devices: _Optional[_Mapping[str, str]] = ...) -> None: ...

class NodeCost(_message.Message):
    __slots__ = ("node", "op", "rounds", "bytes", "seconds", "calls")
    NODE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    node: str
    op: str
    rounds: int
    bytes: int
    seconds: float
    calls: int
    def __init__(self, node: _Optional[str] = ..., op: _Optional[str] = ..., rounds: _Optional[int] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., calls: _Optional[int] = ...) -> None: ...

class RoundMetrics(_message.Message):
    __slots__ = ("round", "metrics", "seconds")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ROUND_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    round: int
    metrics: _containers.ScalarMap[str, float]
    seconds: float
    def __init__(self, round: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., seconds: _Optional[float] = ...) -> None: ...

class PartyOutput(_message.Message):
    __slots__ = ("party", "output", "path", "shape")
    PARTY_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    party: str
    output: _job_pb2.Output
    path: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, party: _Optional[str] = ..., output: _Optional[_Union[_job_pb2.Output, str]] = ..., path: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class DatasetInfo(_message.Message):
    __slots__ = ("name", "columns", "rows", "row_shape", "id_column")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ROW_SHAPE_FIELD_NUMBER: _ClassVar[int]
    ID_COLUMN_FIELD_NUMBER: _ClassVar[int]
    name: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    rows: int
    row_shape: _containers.RepeatedScalarFieldContainer[int]
    id_column: str
    def __init__(self, name: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ..., rows: _Optional[int] = ..., row_shape: _Optional[_Iterable[int]] = ..., id_column: _Optional[str] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("party", "data_address", "device", "datasets", "models", "running_jobs", "max_concurrent_jobs", "health_address", "model_info", "limits")
    PARTY_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_JOBS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_INFO_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    party: str
    data_address: str
    device: str
    datasets: _containers.RepeatedCompositeFieldContainer[DatasetInfo]
    models: _containers.RepeatedScalarFieldContainer[str]
    running_jobs: _containers.RepeatedScalarFieldContainer[str]
    max_concurrent_jobs: int
    health_address: str
    model_info: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    limits: ResourceLimits
    def __init__(self, party: _Optional[str] = ..., data_address: _Optional[str] = ..., device: _Optional[str] = ..., datasets: _Optional[_Iterable[_Union[DatasetInfo, _Mapping]]] = ..., models: _Optional[_Iterable[str]] = ..., running_jobs: _Optional[_Iterable[str]] = ..., max_concurrent_jobs: _Optional[int] = ..., health_address: _Optional[str] = ..., model_info: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., limits: _Optional[_Union[ResourceLimits, _Mapping]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "commitment", "parameters")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    commitment: str
    parameters: _containers.RepeatedCompositeFieldContainer[ParameterInfo]
    def __init__(self, name: _Optional[str] = ..., commitment: _Optional[str] = ..., parameters: _Optional[_Iterable[_Union[ParameterInfo, _Mapping]]] = ...) -> None: ...

class ParameterInfo(_message.Message):
    __slots__ = ("name", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ListPeersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPeersResponse(_message.Message):
    __slots__ = ("peers",)
    PEERS_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[PeerEndpoint]
    def __init__(self, peers: _Optional[_Iterable[_Union[PeerEndpoint, _Mapping]]] = ...) -> None: ...

class PeerEndpoint(_message.Message):
    __slots__ = ("name", "data_address", "health_address")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    data_address: str
    health_address: str
    def __init__(self, name: _Optional[str] = ..., data_address: _Optional[str] = ..., health_address: _Optional[str] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("start", "go", "stop", "vet", "purge")
    START_FIELD_NUMBER: _ClassVar[int]
    GO_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    VET_FIELD_NUMBER: _ClassVar[int]
    PURGE_FIELD_NUMBER: _ClassVar[int]
    start: StartJob
    go: GoRound
    stop: StopJob
    vet: VetJob
    purge: PurgeJob
    def __init__(self, start: _Optional[_Union[StartJob, _Mapping]] = ..., go: _Optional[_Union[GoRound, _Mapping]] = ..., stop: _Optional[_Union[StopJob, _Mapping]] = ..., vet: _Optional[_Union[VetJob, _Mapping]] = ..., purge: _Optional[_Union[PurgeJob, _Mapping]] = ...) -> None: ...

class PurgeJob(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class VetJob(_message.Message):
    __slots__ = ("request_id", "spec", "submitter", "feature_rows", "label_rows")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SUBMITTER_FIELD_NUMBER: _ClassVar[int]
    FEATURE_ROWS_FIELD_NUMBER: _ClassVar[int]
    LABEL_ROWS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    spec: _job_pb2.JobSpec
    submitter: str
    feature_rows: _containers.RepeatedScalarFieldContainer[int]
    label_rows: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., spec: _Optional[_Union[_job_pb2.JobSpec, _Mapping]] = ..., submitter: _Optional[str] = ..., feature_rows: _Optional[_Iterable[int]] = ..., label_rows: _Optional[_Iterable[int]] = ...) -> None: ...

class StartJob(_message.Message):
    __slots__ = ("job_id", "spec", "rank", "peers", "total_rounds", "resume_round", "checkpoint_digest", "attempt", "slot", "submitter", "estimate")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    RESUME_ROUND_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    SUBMITTER_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    spec: _job_pb2.JobSpec
    rank: int
    peers: _containers.RepeatedCompositeFieldContainer[Peer]
    total_rounds: int
    resume_round: int
    checkpoint_digest: str
    attempt: int
    slot: int
    submitter: str
    estimate: ResourceEstimate
    def __init__(self, job_id: _Optional[str] = ..., spec: _Optional[_Union[_job_pb2.JobSpec, _Mapping]] = ..., rank: _Optional[int] = ..., peers: _Optional[_Iterable[_Union[Peer, _Mapping]]] = ..., total_rounds: _Optional[int] = ..., resume_round: _Optional[int] = ..., checkpoint_digest: _Optional[str] = ..., attempt: _Optional[int] = ..., slot: _Optional[int] = ..., submitter: _Optional[str] = ..., estimate: _Optional[_Union[ResourceEstimate, _Mapping]] = ...) -> None: ...

class Peer(_message.Message):
    __slots__ = ("name", "address")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class GoRound(_message.Message):
    __slots__ = ("job_id", "round", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    round: int
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., round: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class StopJob(_message.Message):
    __slots__ = ("job_id", "reason", "committed_round")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_ROUND_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    committed_round: int
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ..., committed_round: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("party", "running_jobs")
    PARTY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    party: str
    running_jobs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, party: _Optional[str] = ..., running_jobs: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerReport(_message.Message):
    __slots__ = ("job_id", "party", "ready", "done", "finished", "failed", "verdict", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    party: str
    ready: Ready
    done: RoundDone
    finished: Finished
    failed: Failure
    verdict: Verdict
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., party: _Optional[str] = ..., ready: _Optional[_Union[Ready, _Mapping]] = ..., done: _Optional[_Union[RoundDone, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ..., failed: _Optional[_Union[Failure, _Mapping]] = ..., verdict: _Optional[_Union[Verdict, _Mapping]] = ..., attempt: _Optional[int] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("request_id", "allowed", "reason", "estimate", "over_limit")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    OVER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    allowed: bool
    reason: str
    estimate: ResourceEstimate
    over_limit: bool
    def __init__(self, request_id: _Optional[str] = ..., allowed: _Optional[bool] = ..., reason: _Optional[str] = ..., estimate: _Optional[_Union[ResourceEstimate, _Mapping]] = ..., over_limit: _Optional[bool] = ...) -> None: ...

class Ready(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    def __init__(self, rows: _Optional[int] = ...) -> None: ...

class RoundDone(_message.Message):
    __slots__ = ("round", "metric_shares", "bytes_sent", "communication_rounds", "seconds", "checkpoint_digest", "traffic")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    METRIC_SHARES_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    COMMUNICATION_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    round: int
    metric_shares: _containers.RepeatedCompositeFieldContainer[MetricShare]
    bytes_sent: int
    communication_rounds: int
    seconds: float
    checkpoint_digest: str
    traffic: _containers.RepeatedCompositeFieldContainer[PeerTraffic]
    def __init__(self, round: _Optional[int] = ..., metric_shares: _Optional[_Iterable[_Union[MetricShare, _Mapping]]] = ..., bytes_sent: _Optional[int] = ..., communication_rounds: _Optional[int] = ..., seconds: _Optional[float] = ..., checkpoint_digest: _Optional[str] = ..., traffic: _Optional[_Iterable[_Union[PeerTraffic, _Mapping]]] = ...) -> None: ...

class PeerTraffic(_message.Message):
    __slots__ = ("peer", "bytes_sent", "bytes_received")
    PEER_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    peer: str
    bytes_sent: int
    bytes_received: int
    def __init__(self, peer: _Optional[str] = ..., bytes_sent: _Optional[int] = ..., bytes_received: _Optional[int] = ...) -> None: ...

class MetricShare(_message.Message):
    __slots__ = ("name", "share", "scale")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    name: str
    share: int
    scale: int
    def __init__(self, name: _Optional[str] = ..., share: _Optional[int] = ..., scale: _Optional[int] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("outputs", "metric_shares", "bytes_sent", "communication_rounds", "traffic", "profile", "first_batch_seconds", "median_batch_seconds", "peak_memory_bytes", "device")
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    METRIC_SHARES_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    COMMUNICATION_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    FIRST_BATCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_BATCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[PartyOutput]
    metric_shares: _containers.RepeatedCompositeFieldContainer[MetricShare]
    bytes_sent: int
    communication_rounds: int
    traffic: _containers.RepeatedCompositeFieldContainer[PeerTraffic]
    profile: _containers.RepeatedCompositeFieldContainer[NodeCost]
    first_batch_seconds: float
    median_batch_seconds: float
    peak_memory_bytes: int
    device: str
    def __init__(self, outputs: _Optional[_Iterable[_Union[PartyOutput, _Mapping]]] = ..., metric_shares: _Optional[_Iterable[_Union[MetricShare, _Mapping]]] = ..., bytes_sent: _Optional[int] = ..., communication_rounds: _Optional[int] = ..., traffic: _Optional[_Iterable[_Union[PeerTraffic, _Mapping]]] = ..., profile: _Optional[_Iterable[_Union[NodeCost, _Mapping]]] = ..., first_batch_seconds: _Optional[float] = ..., median_batch_seconds: _Optional[float] = ..., peak_memory_bytes: _Optional[int] = ..., device: _Optional[str] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("reason", "round", "peer", "traffic")
    REASON_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    reason: str
    round: int
    peer: bool
    traffic: _containers.RepeatedCompositeFieldContainer[PeerTraffic]
    def __init__(self, reason: _Optional[str] = ..., round: _Optional[int] = ..., peer: _Optional[bool] = ..., traffic: _Optional[_Iterable[_Union[PeerTraffic, _Mapping]]] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
