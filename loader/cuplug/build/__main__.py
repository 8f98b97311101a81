"""``python -m cuplug.build``: the build kit's command under its old name (``python -m cuplug.kit``)."""

from cuplug.kit.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
