from mpcml.proto.v1 import graph_pb2 as _graph_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Task(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_UNSPECIFIED: _ClassVar[Task]
    TASK_TRAIN: _ClassVar[Task]
    TASK_INFER: _ClassVar[Task]
    TASK_EVALUATE: _ClassVar[Task]

class Split(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPLIT_UNSPECIFIED: _ClassVar[Split]
    SPLIT_VERTICAL: _ClassVar[Split]
    SPLIT_HORIZONTAL: _ClassVar[Split]

class Loss(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOSS_UNSPECIFIED: _ClassVar[Loss]
    LOSS_BCE: _ClassVar[Loss]
    LOSS_CROSS_ENTROPY: _ClassVar[Loss]
    LOSS_MSE: _ClassVar[Loss]

class Output(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_UNSPECIFIED: _ClassVar[Output]
    OUTPUT_WEIGHTS: _ClassVar[Output]
    OUTPUT_PREDICTIONS: _ClassVar[Output]
    OUTPUT_METRICS: _ClassVar[Output]
TASK_UNSPECIFIED: Task
TASK_TRAIN: Task
TASK_INFER: Task
TASK_EVALUATE: Task
SPLIT_UNSPECIFIED: Split
SPLIT_VERTICAL: Split
SPLIT_HORIZONTAL: Split
LOSS_UNSPECIFIED: Loss
LOSS_BCE: Loss
LOSS_CROSS_ENTROPY: Loss
LOSS_MSE: Loss
OUTPUT_UNSPECIFIED: Output
OUTPUT_WEIGHTS: Output
OUTPUT_PREDICTIONS: Output
OUTPUT_METRICS: Output

class Approximation(_message.Message):
    __slots__ = ("implementation", "knobs", "calibrated", "low", "high")
    class KnobsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    IMPLEMENTATION_FIELD_NUMBER: _ClassVar[int]
    KNOBS_FIELD_NUMBER: _ClassVar[int]
    CALIBRATED_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    implementation: str
    knobs: _containers.ScalarMap[str, float]
    calibrated: bool
    low: float
    high: float
    def __init__(self, implementation: _Optional[str] = ..., knobs: _Optional[_Mapping[str, float]] = ..., calibrated: _Optional[bool] = ..., low: _Optional[float] = ..., high: _Optional[float] = ...) -> None: ...

class ApproximationPlan(_message.Message):
    __slots__ = ("source", "nodes", "ops")
    class NodesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Approximation
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Approximation, _Mapping]] = ...) -> None: ...
    class OpsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Approximation
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Approximation, _Mapping]] = ...) -> None: ...
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    source: str
    nodes: _containers.MessageMap[str, Approximation]
    ops: _containers.MessageMap[str, Approximation]
    def __init__(self, source: _Optional[str] = ..., nodes: _Optional[_Mapping[str, Approximation]] = ..., ops: _Optional[_Mapping[str, Approximation]] = ...) -> None: ...

class DataBinding(_message.Message):
    __slots__ = ("party", "dataset", "columns")
    PARTY_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    party: str
    dataset: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, party: _Optional[str] = ..., dataset: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ...) -> None: ...

class PrivateWeights(_message.Message):
    __slots__ = ("party", "model", "commitment")
    PARTY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    party: str
    model: str
    commitment: str
    def __init__(self, party: _Optional[str] = ..., model: _Optional[str] = ..., commitment: _Optional[str] = ...) -> None: ...

class WeightSource(_message.Message):
    __slots__ = ("init_seed", "private", "from_job")
    INIT_SEED_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_FIELD_NUMBER: _ClassVar[int]
    FROM_JOB_FIELD_NUMBER: _ClassVar[int]
    init_seed: int
    private: PrivateWeights
    from_job: str
    def __init__(self, init_seed: _Optional[int] = ..., private: _Optional[_Union[PrivateWeights, _Mapping]] = ..., from_job: _Optional[str] = ...) -> None: ...

class HyperParameters(_message.Message):
    __slots__ = ("epochs", "batch_size", "learning_rate", "momentum", "weight_decay", "loss", "batches_per_round", "shuffle", "shuffle_seed", "crypten_loss", "trainable")
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_SEED_FIELD_NUMBER: _ClassVar[int]
    CRYPTEN_LOSS_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_FIELD_NUMBER: _ClassVar[int]
    epochs: int
    batch_size: int
    learning_rate: float
    momentum: float
    weight_decay: float
    loss: Loss
    batches_per_round: int
    shuffle: bool
    shuffle_seed: int
    crypten_loss: bool
    trainable: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, epochs: _Optional[int] = ..., batch_size: _Optional[int] = ..., learning_rate: _Optional[float] = ..., momentum: _Optional[float] = ..., weight_decay: _Optional[float] = ..., loss: _Optional[_Union[Loss, str]] = ..., batches_per_round: _Optional[int] = ..., shuffle: _Optional[bool] = ..., shuffle_seed: _Optional[int] = ..., crypten_loss: _Optional[bool] = ..., trainable: _Optional[_Iterable[str]] = ...) -> None: ...

class Reveal(_message.Message):
    __slots__ = ("output", "recipients")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    RECIPIENTS_FIELD_NUMBER: _ClassVar[int]
    output: Output
    recipients: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, output: _Optional[_Union[Output, str]] = ..., recipients: _Optional[_Iterable[str]] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "task", "graph", "weights", "features", "labels", "split", "align_on", "hyper", "reveal", "parties", "insecure_provider", "approximations")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    ALIGN_ON_FIELD_NUMBER: _ClassVar[int]
    HYPER_FIELD_NUMBER: _ClassVar[int]
    REVEAL_FIELD_NUMBER: _ClassVar[int]
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    INSECURE_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    APPROXIMATIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    task: Task
    graph: _graph_pb2.Graph
    weights: WeightSource
    features: _containers.RepeatedCompositeFieldContainer[DataBinding]
    labels: _containers.RepeatedCompositeFieldContainer[DataBinding]
    split: Split
    align_on: str
    hyper: HyperParameters
    reveal: _containers.RepeatedCompositeFieldContainer[Reveal]
    parties: _containers.RepeatedScalarFieldContainer[str]
    insecure_provider: str
    approximations: ApproximationPlan
    def __init__(self, name: _Optional[str] = ..., task: _Optional[_Union[Task, str]] = ..., graph: _Optional[_Union[_graph_pb2.Graph, _Mapping]] = ..., weights: _Optional[_Union[WeightSource, _Mapping]] = ..., features: _Optional[_Iterable[_Union[DataBinding, _Mapping]]] = ..., labels: _Optional[_Iterable[_Union[DataBinding, _Mapping]]] = ..., split: _Optional[_Union[Split, str]] = ..., align_on: _Optional[str] = ..., hyper: _Optional[_Union[HyperParameters, _Mapping]] = ..., reveal: _Optional[_Iterable[_Union[Reveal, _Mapping]]] = ..., parties: _Optional[_Iterable[str]] = ..., insecure_provider: _Optional[str] = ..., approximations: _Optional[_Union[ApproximationPlan, _Mapping]] = ...) -> None: ...
