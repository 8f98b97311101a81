"""``cuplug.build``: the build kit's old name, kept so ``python -m cuplug.build ...``, ``from cuplug.build import
toolchain`` and ``import cuplug.build.gate`` in existing projects go on working. The kit is ``cuplug.kit`` (a
folder named ``build`` is skipped by the tools that skip build outputs); this package is an alias of it: each of
its modules is the kit's own module object, never a second copy."""

from __future__ import annotations

import importlib
import pkgutil
import sys

from cuplug import kit as _kit

for _info in pkgutil.iter_modules(_kit.__path__):
    if _info.name != "__main__":
        _module = importlib.import_module(f"cuplug.kit.{_info.name}")
        sys.modules[f"{__name__}.{_info.name}"] = _module
        globals()[_info.name] = _module
