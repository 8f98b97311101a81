"""cuplug's exception taxonomy: one base class, narrow subclasses."""

from __future__ import annotations


class CuplugError(Exception):
    """Base of every error cuplug raises on purpose."""


class ConfigError(CuplugError, ValueError):
    """An environment variable or argument has a value cuplug does not accept."""


class InvalidInputError(CuplugError, ValueError):
    """An operand is unusable: wrong dtype, not contiguous, wrong length, empty."""


class UnknownOpError(CuplugError, ValueError):
    """The operation name is not one the backend implements."""


class BackendClosedError(CuplugError, RuntimeError):
    """The Backend (or Buffer) was closed and cannot be used any more."""


class BackendError(CuplugError, RuntimeError):
    """The backend library returned an error code; ``status`` is that code."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class BufferError_(BackendError):
    """A resident buffer id is stale, freed or belongs to another instance."""


class OutOfMemoryError(BackendError, MemoryError):
    """The backend could not allocate host or device memory."""


class BackendNotAvailable(CuplugError, RuntimeError):
    """No backend could serve (CUPLUG_REQUIRE_CUDA=1 and CUDA failed); ``code`` is the reason code."""

    def __init__(self, message: str, code: str, trace: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.trace = trace


class ArtifactError(CuplugError):
    """An artifact failed verification or loading; ``code`` is the reason code."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


SHOWN_CHARS = 120  # how much of a caller's value a message echoes: a 10 MB op name is cut, not copied


def cut(text: str) -> str:
    """``text`` as a message shows it: at most SHOWN_CHARS characters, saying how long it was."""
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[: SHOWN_CHARS - 20]}... ({len(text)} characters)"


def shown(value: object) -> str:
    """``repr(value)``, cut (a hostile ``__repr__`` is named, not raised)."""
    try:
        return cut(repr(value))
    except Exception as exc:
        return f"<{type(value).__name__} whose repr() failed: {type(exc).__name__}>"
