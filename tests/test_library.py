"""The backend library binding (runtime.library), in process: how a verified file is opened and bound.

Only an absolute path is opened, with RTLD_NOW | RTLD_LOCAL (nothing leaks into the process's
global symbols); the ABI version is checked before the symbols, so a library of another version is
named as such; every failure is an ArtifactError with its reason code; the ping's answer must be a
JSON object; messages name the real file, never the sealed copy it was mapped from.
"""

from __future__ import annotations

import ctypes
from typing import ClassVar

import pytest

from conftest import HERE, ROOT, build_shared_library
from cuplug.contract import abi, reasons
from cuplug.contract.errors import ArtifactError
from cuplug.runtime import library


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    out = tmp_path_factory.mktemp("odd-lib")
    flags = {
        "abi99": ["-DODD_ABI_VERSION=99"],
        "v1": ["-DODD_ABI_V1"],
        "null": ["-DODD_CREATE_NULL"],
        "missing": ["-DODD_MISSING_SYMBOLS"],
    }
    return {
        kind: build_shared_library(
            HERE / "fake_backends" / "odd_backend.c",
            out / f"{kind}.so",
            "-fvisibility=hidden",
            *f,
            f"-I{ROOT / 'backends' / 'include'}",
        )
        for kind, f in flags.items()
    }


def _refused(path, code: str, words: str) -> None:
    with pytest.raises(ArtifactError) as err:
        library.BackendLibrary(str(path))
    assert err.value.code == code and words in str(err.value), str(err.value)


def test_a_relative_path_is_never_opened(cpu_lib_path, monkeypatch):
    monkeypatch.chdir(cpu_lib_path.parent)
    _refused(cpu_lib_path.name, reasons.LOAD_FAILED, "not an absolute path")


def test_a_file_that_cannot_be_opened_is_load_failed(tmp_path):
    _refused(tmp_path / "missing.so", reasons.LOAD_FAILED, "dlopen(")
    bad = tmp_path / "bad.so"
    bad.write_bytes(b"\x7fELF" + b"\0" * 100)
    _refused(bad, reasons.LOAD_FAILED, "dlopen(")


def test_the_abi_version_is_checked_first(odd):
    _refused(odd["abi99"], reasons.ABI_MISMATCH, f"implements backend ABI v99, this cuplug needs v{abi.ABI_VERSION}")
    _refused(odd["v1"], reasons.ABI_MISMATCH, "ABI v1")  # a v1 library lacks v2's symbols: the version is the reason


def test_missing_symbols_are_named(odd):
    with pytest.raises(ArtifactError) as err:
        library.BackendLibrary(str(odd["missing"]))
    assert err.value.code == reasons.LOAD_FAILED and "lacks ABI symbols" in str(err.value)
    assert all(s in str(err.value) for s in abi.SYMBOLS if s != "cuplug_backend_abi_version")


def test_loaded_locally_and_bound_lazily(cpu_lib_path):
    lib = library.BackendLibrary(str(cpu_lib_path))
    assert not hasattr(ctypes.CDLL(None), "cuplug_backend_create")  # RTLD_LOCAL: not in the global namespace
    assert lib.abi_version() == abi.ABI_VERSION and lib.path == str(cpu_lib_path)
    assert "call" not in vars(lib) and "sync" in vars(lib)  # the tensor-taking entry points wait for their first use
    call = lib.call
    assert vars(lib)["call"] is call and call.argtypes[2] is abi.ABI_TYPES["tensor*"]
    with pytest.raises(AttributeError):
        lib.not_an_entry_point  # noqa: B018
    with pytest.raises(AttributeError):
        lib._private  # noqa: B018


def test_create_ping_destroy(cpu_lib_path):
    lib, handle, info = library.open_backend(str(cpu_lib_path), "/shown/path.so", "0")
    try:
        assert lib.path == "/shown/path.so" and handle and info["variant"] == "cpu" and "ops" in info
        rc, text = lib.ping(handle)
        assert rc == abi.OK and library.parse_ping(text)["variant"] == "cpu"
    finally:
        lib.destroy(handle)


def test_create_null_is_load_failed_with_the_backends_reason(odd):
    lib = library.BackendLibrary(str(odd["null"]))
    with pytest.raises(ArtifactError) as err:
        lib.create("0")
    assert err.value.code == reasons.LOAD_FAILED and "cuplug_backend_create failed" in str(err.value)
    assert "no reason given" not in str(err.value)  # the odd backend gives one


def test_open_backend_names_the_real_file(odd, tmp_path):
    with pytest.raises(ArtifactError) as err:
        library.open_backend(str(odd["abi99"]), "/real/libcuplug_vector.so", "0")
    assert err.value.code == reasons.ABI_MISMATCH
    assert "abi99.so" not in str(err.value) and str(err.value).startswith("libcuplug_vector.so implements")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("not json", ValueError),
        ("[1, 2]", ValueError),
        ("NaN", ValueError),
        ("[" * 100_000, RecursionError),
        ("", ValueError),
    ],
)
def test_only_a_json_object_is_a_ping(text, error):
    with pytest.raises(error):
        library.parse_ping(text)


def test_a_ping_too_long_is_refused_and_the_limit_accepted():
    body = '{"a": "' + "x" * (library.MAX_PING_JSON - 10) + '"}'
    assert len(library.parse_ping(body)["a"]) == library.MAX_PING_JSON - 10
    with pytest.raises(ValueError, match="bytes"):
        library.parse_ping('{"a": "' + "x" * library.MAX_PING_JSON + '"}')
    assert library.parse_ping(' {"variant": "x"} ') == {"variant": "x"}


def test_messages_name_the_real_file_not_the_sealed_copy():
    shown = library._shown("/proc/self/fd/7 is not ok; dlopen(/proc/self/fd/7)", "/proc/self/fd/7", "/site/x/lib.so")
    assert shown == "/site/x/lib.so is not ok; dlopen(/site/x/lib.so)"
    assert (
        library._shown("7 lacks ABI symbols: a", "/proc/self/fd/7", "/site/x/lib.so") == "lib.so lacks ABI symbols: a"
    )
    assert library._shown("70 other", "/proc/self/fd/7", "/site/x/lib.so") == "70 other"


def test_long_texts_are_read_whole():
    """A text longer than the first buffer (last_error, create's reason) is asked for again with the
    length the backend says it needs (snprintf's contract), so nothing is cut."""
    text = b"e" * 5000 + b"!"
    calls = []

    def backend_text(buf, n):
        calls.append(n)
        if n > len(text):
            ctypes.memmove(buf, text, len(text))
        return len(text)

    assert library._read_text(backend_text) == text.decode() and calls == [4096, len(text) + 1]


def test_a_text_exactly_the_first_buffers_size_is_asked_for_again():
    text = b"e" * 4096  # needs 4097 bytes with its NUL
    calls = []

    def backend_text(buf, n):
        calls.append(n)
        ctypes.memmove(buf, text[: n - 1] + b"\0", min(len(text), n - 1) + 1)
        return len(text)

    assert library._read_text(backend_text) == text.decode() and calls == [4096, 4097]


class _PingOnly:
    """A backend library's ping and last_error (snprintf's contract: the length needed is returned)."""

    def __init__(self, *answers):
        self.answers, self.sizes = list(answers), []

    def cuplug_backend_ping(self, handle, buf, n):
        self.sizes.append(n)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, int):  # a status (< 0) or a length claimed without text
            return answer
        data = answer.encode()[: n - 1]
        ctypes.memmove(buf, data + b"\0", len(data) + 1)
        return len(answer.encode())

    def cuplug_backend_last_error(self, handle, buf, n):
        ctypes.memmove(buf, b"the device fell off the bus\0", 28)
        return 27


def _ping(*answers):
    lib = library.BackendLibrary.__new__(library.BackendLibrary)
    lib.lib = _PingOnly(*answers)
    return lib.ping(1), lib.lib.sizes


def test_a_description_up_to_64_kib_is_read_in_one_call():
    assert _ping('{"a": 1}') == ((abi.OK, '{"a": 1}'), [1 << 16])
    assert _ping("") == ((abi.OK, ""), [1 << 16])  # an empty answer is an answer (status 0)
    assert _ping("x" * 65535) == ((abi.OK, "x" * 65535), [1 << 16])


@pytest.mark.parametrize("length", [65536, 70000, 70001])
def test_a_longer_description_is_asked_for_again_with_the_length_needed(length):
    (rc, text), sizes = _ping("d" * length)
    assert rc == abi.OK and text == "d" * length and sizes == [1 << 16, length + 1]


def test_a_description_that_keeps_growing_is_followed_twice_then_refused():
    grows = ["g" * 70000, "g" * 80000, "g" * 80000]
    (rc, text), sizes = _ping(*grows)
    assert rc == abi.OK and text == "g" * 80000 and sizes == [1 << 16, 70001, 80001]
    (rc, text), sizes = _ping("g" * 70000, "g" * 80000, "g" * 90000, "g" * 90000)
    assert (rc, text) == (abi.E_INVALID_ARGUMENT, "ping: the backend's description kept growing") and len(sizes) == 3


def test_a_description_over_16_mib_is_refused_without_reading_it():
    limit = 16 << 20
    (rc, text), sizes = _ping(limit + 1)
    assert (rc, text) == (
        abi.E_INVALID_ARGUMENT,
        f"ping: the backend's description is {limit + 1} bytes (limit {limit})",
    )
    assert sizes == [1 << 16]
    (rc, _), sizes = _ping(limit, "")  # the limit itself is read
    assert rc == abi.OK and sizes == [1 << 16, limit + 1]


@pytest.mark.parametrize("status", [-1, -5, -6])
def test_a_failed_ping_returns_its_status_and_the_backends_last_error(status):
    assert _ping(status) == ((status, "the device fell off the bus"), [1 << 16])


class _Opened:
    """What open_backend drives: create, ping, destroy."""

    destroyed: ClassVar[list[int]] = []

    def __init__(self, path):
        self.path = path

    def create(self, device):
        return 7

    def ping(self, handle):
        status, text = self.answer
        return int(str(status)), text  # a status from C: a fresh int object, as ctypes returns it

    def destroy(self, handle):
        _Opened.destroyed.append(handle)


@pytest.mark.parametrize(
    ("answer", "code", "message"),
    [
        ((abi.E_NO_KERNEL_IMAGE, "no kernel image for sm_90"), reasons.KERNEL_IMAGE_MISSING, "ping: no kernel image"),
        ((abi.E_DEVICE, "illegal address"), reasons.LOAD_FAILED, "ping: illegal address"),
        ((abi.E_WRONG_DEVICE, "another device"), reasons.LOAD_FAILED, "ping: another device"),
        ((abi.E_BUFFER_TOO_SMALL, "small"), reasons.LOAD_FAILED, "ping: small"),
        ((abi.E_INVALID_ARGUMENT, "bad"), reasons.LOAD_FAILED, "ping: bad"),
        ((abi.OK, "[1, 2]"), reasons.LOAD_FAILED, "ping returned no usable JSON object: a JSON list"),
        ((abi.OK, "{not json"), reasons.LOAD_FAILED, "ping returned no usable JSON object"),
        ((abi.OK, "[" * 100_000), reasons.LOAD_FAILED, "ping returned no usable JSON object"),
    ],
)
def test_a_ping_that_fails_names_why_and_destroys_the_instance(monkeypatch, answer, code, message):
    monkeypatch.setattr(library, "BackendLibrary", type("Lib", (_Opened,), {"answer": answer}))
    _Opened.destroyed.clear()
    with pytest.raises(ArtifactError) as err:
        library.open_backend("/x/lib.so", "/x/lib.so", None)
    assert err.value.code == code and str(err.value).startswith(message) and _Opened.destroyed == [7]


def test_an_entry_point_asked_of_a_library_not_opened_names_itself():
    lib = library.BackendLibrary.__new__(library.BackendLibrary)
    with pytest.raises(AttributeError, match=r"^call$"):
        lib.call  # noqa: B018 - the lookup is the behaviour under test
    with pytest.raises(AttributeError):
        lib.not_an_entry_point  # noqa: B018


def test_a_short_text_costs_one_call():
    calls = []

    def backend_text(buf, n):
        calls.append(n)
        ctypes.memmove(buf, b"no device\0", 10)
        return 9

    assert library._read_text(backend_text) == "no device" and calls == [4096]


def test_a_ping_json_of_up_to_1_mib_is_parsed():
    limit = 1 << 20
    exact = '{"a": "' + "x" * (limit - 9) + '"}'
    assert len(exact) == limit and len(library.parse_ping(exact)["a"]) == limit - 9
    with pytest.raises(ValueError, match=f"^{limit + 1} bytes$"):
        library.parse_ping(exact + " ")


def test_the_device_preference_reaches_the_backends_create():
    seen = []

    class Create:
        def cuplug_backend_create(self, pref):
            seen.append(pref)
            return 42

    lib = library.BackendLibrary.__new__(library.BackendLibrary)
    lib.lib = Create()
    assert lib.create("cuda:1") == 42 and lib.create(None) == 42 and lib.create("") == 42
    assert seen == [b"cuda:1", None, None]
