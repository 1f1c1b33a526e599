"""Registry of preference sources: `build_source(name)` -> adapter yielding records of one schema.

Registered by name: the six hub datasets (`hub.py`), RewardBench (`rewardbench.py`), the synthetic benchmark
(`synthetic.py`), the VADER ICWSM corpus's four domains (`vader_icwsm.py`); by prefix: your own files,
`local:<path>` (`local_files.py`).

`base.py` holds the registry and knows no source; a source module registers itself when imported, and this package
imports the built-in ones below, so any import of the package (or of one of its modules) fills the registry. A new
built-in source is one more module in that import line.
"""
from datamodules.preference.sources.base import (  # noqa: F401
    SOURCE_PREFIXES,
    SOURCES,
    DataError,
    PreferenceSource,
    SourceSplit,
    build_source,
    is_known_source,
    known_sources_hint,
    register_source,
)

# After base: each module registers its sources in base's registry as it is imported.
from datamodules.preference.sources import hub, local_files, rewardbench, synthetic, vader_icwsm  # noqa: E402,F401
