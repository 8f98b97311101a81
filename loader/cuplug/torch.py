"""``cuplug.torch.register(backend, "mylib")``: a backend's ops as ``torch.ops.mylib.*`` (see
``cuplug.frameworks.torch``). Importing this module does not import PyTorch."""

from __future__ import annotations

from .frameworks.torch import output_names, register, schemas

__all__ = ["output_names", "register", "schemas"]
