"""Reading a cached tokenized split (`<cache_dir>/tokenized/<kind>-<records>-<tokenizer>/`), which may be damaged.

A split is written whole or not at all (`datamodule.atomic_save_dataset`), but a cache folder can still be damaged
afterwards: a copy or sync of the cache cut short, a full disk while another tool rewrote it, a file system that lost
the tail of an Arrow file. `datasets.load_from_disk` then fails with pyarrow's "Expected to read 1336 metadata bytes,
but only read 992", naming no file, on every run until the folder is deleted by hand. A cache is only a copy of what
the records and the tokenizer give, so a split that cannot be read is removed, named in one line, and rebuilt; one
that cannot even be removed is refused with its path and the command that clears it.
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Optional

from lightning.pytorch.utilities import rank_zero_warn

from datamodules.atomic_files import temp_path
from datamodules.preference.sources import DataError


def load_cached_split(path: str) -> Optional[Any]:
    """The `datasets.Dataset` cached at `path`; None when there is none, or when it cannot be read (then it is
    removed, with a warning naming it, and the caller builds it again).

    Raises:
        DataError: the damaged folder cannot be removed (permissions, a read-only cache): its path and `rm -rf`.
    """
    import datasets

    if not os.path.isdir(path):
        return None
    try:
        return datasets.load_from_disk(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError; a short read an OSError
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        try:
            aside = temp_path(path)  # renamed first: a reader in another process never sees half a removal
            os.rename(path, aside)
            shutil.rmtree(aside)
        except OSError as rm_err:
            raise DataError(f"the tokenized cache {path} cannot be read ({reason}) nor removed ({rm_err}); clear it "
                            f"with: rm -rf '{path}' (it is rebuilt from the data on the next run)") from err
        rank_zero_warn(f"the tokenized cache {path} could not be read ({reason}): removed; it is rebuilt now")
        return None
