"""Registry of preference sources: `build_source(name)` -> adapter yielding records of one schema."""
from datamodules.sources.base import (  # noqa: F401
    SOURCES,
    DataError,
    PreferenceSource,
    SourceSplit,
    build_source,
    register_source,
)
