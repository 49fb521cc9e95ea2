"""The one typed settings object (`streamjoin.settings`): a leaf of the import
graph, so every layer can read the job without importing any other layer.

One module per section of the job file (streams, join, output, worker, coordinator, ring,
splitjoin, queries, topics, kafka and transactions, and dev's workload and faults), `job`
for `JobSettings` itself and `loading` for reading a job file, the environment and flags."""

from streamjoin.settings.coordinator import CoordinatorSpec
from streamjoin.settings.dev import FaultSpec, WorkloadSpec
from streamjoin.settings.job import JobSettings
from streamjoin.settings.join import JoinSpec, PredicateTerm
from streamjoin.settings.kafka import ConsumerSpec, TransactionSpec
from streamjoin.settings.loading import SettingsError, load
from streamjoin.settings.output import OutputSpec
from streamjoin.settings.queries import QueriesSpec
from streamjoin.settings.ring import RingSpec
from streamjoin.settings.splitjoin import SplitJoinSpec
from streamjoin.settings.streams import FieldType, StreamSpec, WindowSpec
from streamjoin.settings.topics import ROLES, TopicRole, TopicSettings, TopicsSpec
from streamjoin.settings.worker import SpillSpec, WorkerSpec

__all__ = ["ConsumerSpec", "CoordinatorSpec", "FaultSpec", "FieldType", "JobSettings", "JoinSpec",
           "OutputSpec", "PredicateTerm", "QueriesSpec", "ROLES", "RingSpec", "SettingsError", "SpillSpec",
           "SplitJoinSpec", "StreamSpec", "TopicRole", "TopicSettings", "TopicsSpec", "TransactionSpec",
           "WindowSpec", "WorkerSpec", "WorkloadSpec", "load"]
