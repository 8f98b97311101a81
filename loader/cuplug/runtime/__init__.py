"""The runtime: what ``cuplug.load()`` runs, on top of the contract core.

policy (environment knobs) -> driver (probe) -> discovery (installed, trusted packages)
-> select (the whole decision, a pure function) -> verify (sealed copy) -> library
(dlopen, the ctypes binding) -> Backend (api). ``trace`` records the decision and the
load attempts. Nothing here imports the operator's tools or the build kit.
"""
