"""Where cuplug keeps what it makes once for a user (toolchains, the XLA handler, self-test passes): one rule."""

from __future__ import annotations

import os


def cache_root() -> str:
    """``$CUPLUG_CACHE_DIR``, else ``$XDG_CACHE_HOME/cuplug``, else ``~/.cache/cuplug`` (a path; nothing is made)."""
    if os.environ.get("CUPLUG_CACHE_DIR"):
        return os.environ["CUPLUG_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cuplug")
