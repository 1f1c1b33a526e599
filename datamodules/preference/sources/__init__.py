"""Registry of preference sources: `build_source(name)` -> adapter yielding records of one schema.

Registered by name: the six hub datasets (`hub.py`), RewardBench (`rewardbench.py`), the synthetic benchmark
(`synthetic.py`); by prefix: your own files, `local:<path>` (`local_files.py`).
"""
from datamodules.preference.sources.base import (  # noqa: F401
    SOURCES,
    DataError,
    PreferenceSource,
    SourceSplit,
    build_source,
    is_known_source,
    known_sources_hint,
    register_source,
)
