"""Registry of preference sources: `build_source(name)` -> adapter yielding records of one schema."""
from datamodules.preference.sources.base import (  # noqa: F401
    SOURCES,
    DataError,
    PreferenceSource,
    SourceSplit,
    build_source,
    register_source,
)
