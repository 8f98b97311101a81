"""``cuplug.jax.register(backend)``: a backend's ops as JAX FFI targets, usable inside ``jax.jit`` (see
``cuplug.frameworks.jax``). Importing this module does not import JAX."""

from __future__ import annotations

from .frameworks.jax import handler_library, register

__all__ = ["handler_library", "register"]
