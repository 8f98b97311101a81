"""The contract core: what the runtime, the operator's tools and the build kit agree on.

The backend C ABI (versions, status codes, entry points and their signatures, dtypes),
the CUDA compatibility facts (PTX ISA -> driver, runtime -> minimum driver, arch names),
the reason and exit codes, and the manifest (one typed model, read and written for a
directory and a wheel, its size/sha256 check, its JSON Schema). Modules here import
nothing from cuplug outside this package.
"""
