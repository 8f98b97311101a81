"""Sphinx configuration of cuplug's docs (``nox -s docs``: offline, warnings are errors)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "loader"))  # the API reference reads the package's docstrings
sys.path.insert(0, str(HERE / "_ext"))

project = "cuplug"
author = "cuplug developers"
release = version = __import__("cuplug").__version__
extensions = ["myst_parser", "sphinx.ext.autodoc", "cuplug_reference"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # annotations are strings (PEP 563); the docstrings say what each takes
html_theme = "furo"
html_title = "cuplug"
# Links to the repository's own files outside this site (bench/results/..., examples/...) are kept as
# plain links by MyST and checked by the repository's tests, not by Sphinx.
suppress_warnings = ["myst.xref_missing"]
