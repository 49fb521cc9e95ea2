"""The one typed settings object (`streamjoin.settings`): a leaf of the import
graph, so every layer can read the job without importing any other layer."""

from streamjoin.settings.job import (
    CoordinatorSpec,
    FieldType,
    JobSettings,
    JoinSpec,
    OutputSpec,
    PredicateTerm,
    SettingsError,
    SpillSpec,
    StreamSpec,
    WindowSpec,
    load,
)
from streamjoin.settings.topics import ROLES, TopicRole, TopicSettings, TopicsSpec

__all__ = ["CoordinatorSpec", "FieldType", "JobSettings", "JoinSpec", "OutputSpec", "PredicateTerm", "ROLES",
           "SettingsError", "SpillSpec", "StreamSpec", "TopicRole", "TopicSettings", "TopicsSpec", "WindowSpec", "load"]
