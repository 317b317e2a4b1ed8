"""The standard library's C `audioop`, without its deprecation warning.

Deprecated in Python 3.11-3.12 and gone from 3.13, where the `audioop-lts` package (a
dependency from 3.13 on) provides the same module. Used for what runs on every frame of every
call: G.711 decoding and frame levels.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

__all__ = ["audioop"]
