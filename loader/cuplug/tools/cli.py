"""The operator's commands: ``cuplug probe``, ``doctor``, ``inspect`` and ``warmup``."""

from __future__ import annotations

import argparse
import array
import json
import os
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from .. import __version__
from ..contract import reasons
from ..contract.errors import CuplugError
from ..runtime.trace import DOCTOR_SCHEMA, printable, tag
from .warmup import EXIT_CACHE_UNUSABLE

PROBE_EXIT_HELP = reasons.exit_help()


MAX_TIMEOUT = 86_400.0


# An operator's answer in seconds: cuInit of a healthy 8-GPU host takes a few (without the persistence
# daemon), a hung driver never answers; --timeout raises it for a slower machine (warmup's JIT: 600).
STEP_TIMEOUT = 10.0


def _timeout(text: str) -> float:
    """--timeout: a finite number of seconds, > 0 and <= a day (0, negative, nan, inf are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= MAX_TIMEOUT:  # also false for nan
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds > 0 and <= {MAX_TIMEOUT:.0f}")
    return value


def _say(text: str) -> str:
    return "\n".join(printable(line) for line in text.split("\n"))


class _Steps:
    """Runs the body in a worker so a hung driver call cannot hang the command."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.step = "start"

    def run(self, body: Any) -> int:
        result: list[int] = []

        def worker() -> None:
            try:
                result.append(body(self))
            except CuplugError as exc:
                print(f"cuplug: {self.step}: {_say(str(exc))}", file=sys.stderr)
                result.append(2)
            except Exception as exc:  # never a traceback from an operator's tool
                print(f"cuplug: {self.step}: internal error: {type(exc).__name__}: {_say(str(exc))}", file=sys.stderr)
                result.append(1)

        t = threading.Thread(target=worker, daemon=True)
        t.start()
        t.join(self.timeout)
        if t.is_alive():
            print(
                f"cuplug: step '{self.step}' did not finish within {self.timeout:g} s; "
                "the driver or GPU is not answering (check nvidia-smi, dmesg; a slow but working machine: --timeout)",
                file=sys.stderr,
            )
            sys.stderr.flush()
            os._exit(reasons.EXIT_CODES[reasons.DRIVER_INIT_FAILED])
        return result[0] if result else 1


def _probe_body(args: argparse.Namespace) -> Any:
    def body(steps: _Steps) -> int:
        from ..runtime import loading

        out: dict[str, Any] = {"ok": False}
        t0 = time.perf_counter()
        steps.step = "load"
        backend = loading.load(args.backend)
        trace = backend.trace
        out.update(
            variant=backend.variant,
            cuda=backend.cuda,
            code=trace.decision_code,
            reason=trace.decision_reason,
            attempts=[a.to_json() for a in trace.attempts],
        )
        try:
            steps.step = "info"
            info = backend.info()
            out["device"] = info.get("device", {}).get("name")
            if args.backend == "vector":
                steps.step = "vector add"
                n = (1 << 20) + 3  # many blocks and a scalar tail
                x = array.array("f", (float(i % 1000) for i in range(n)))
                y = array.array("f", (float((3 * i) % 7) for i in range(n)))
                t1 = time.perf_counter()
                got = backend.run("add", x, y)
                out["add_ms"] = round((time.perf_counter() - t1) * 1e3, 3)
                bad = next((i for i in range(n) if got[i] != x[i] + y[i]), None)
                if bad is not None:
                    raise _WrongResult(f"wrong result at {bad}: {got[bad]} != {x[bad] + y[bad]}")
            steps.step = "every op on its sample, against the CPU twin"
            out["ops"] = _probe_ops(backend, args.backend, steps)
            out["ok"] = True
        except _WrongResult as exc:
            out["error"] = f"{steps.step}: {exc}"
        except CuplugError as exc:
            out["error"] = f"{steps.step}: {exc}"
        finally:
            backend.close()
        out["total_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
        if not out["ok"]:
            code = reasons.EXIT_KERNEL_FAILED
        elif backend.variant != "cpu" or trace.decision_code == reasons.FORCED or args.allow_cpu:
            code = reasons.EXIT_OK
        else:
            code = reasons.EXIT_CODES.get(trace.decision_code, 14)
        out["exit_code"] = code
        fell = trace.fell_through
        if fell is not None:
            out["fell_through"] = fell.to_json()
        if args.json:
            print(json.dumps(out, indent=2))
        else:
            where = f"{backend.cuda}/{backend.variant}" if backend.cuda else "cpu"
            verdict = "ok" if out["ok"] else f"FAILED ({out.get('error')})"
            what = f"vector add of {(1 << 20) + 3} elements" if args.backend == "vector" else f"backend {args.backend}"
            against = "checked against the CPU twin" if backend.variant != "cpu" else "run on their samples"
            ops = f", {len(out.get('ops', {}))} op(s) {against}" if out.get("ops") else ""
            took = f" in {out['add_ms']} ms" if "add_ms" in out else ""
            forced = (
                f" (CUPLUG_BACKEND={trace.policy.raw_forced}: {fell.label} {fell.code}, fell through)" if fell else ""
            )
            print(
                _say(
                    f"cuplug probe: {where} on {out.get('device')}: {what} {verdict}{ops}{took} "
                    f"(total {out['total_ms']} ms){forced}"
                )
            )
            if fell is not None:
                print(_say(f"cuplug probe: forced {fell.label} failed: {fell.reason}"))
            if backend.variant == "cpu":
                print(_say(f"cuplug probe: CPU fallback, reason {trace.decision_code}: {trace.decision_reason}"))
            print(f"cuplug probe: exit {code}")
        return code

    return body


class _WrongResult(Exception):
    """A backend answered, but not what the host computes."""


def _probe_ops(backend: Any, name: str, steps: Any) -> dict[str, float]:
    """Every op once on its declared sample, compared with the CPU twin's answer; ms per op."""
    from ..runtime import loading, samples

    times: dict[str, float] = {}
    twin = backend if backend.variant == "cpu" else loading.load(name, env={**os.environ, "CUPLUG_BACKEND": "cpu"})
    try:
        for sig in backend.ops.values():
            steps.step = f"op {sig.name} on its sample"
            t = time.perf_counter()
            got = samples.run_sample(backend, sig)
            times[sig.name] = round((time.perf_counter() - t) * 1e3, 3)
            if twin is not backend:
                why = samples.compare(got, samples.run_sample(twin, twin.ops[sig.name]))
                if why:
                    raise _WrongResult(f"{sig.name}: {why}")
    finally:
        if twin is not backend:
            twin.close()
    return times


def cmd_probe(args: argparse.Namespace) -> int:
    return _Steps(args.timeout).run(_probe_body(args))


def _variant_rows(trace: Any) -> list[dict[str, Any]]:
    """Which variant wheel (PEP 825) of the backend is installed, and whether it still fits the device."""
    from . import variant_check

    return variant_check.report(trace.probe, trace.policy.device, packages=trace.packages)


def _print_variants(trace: Any) -> None:
    from . import variant_check

    for line in variant_check.format_report(_variant_rows(trace)):
        print(_say(f"{tag(trace.backend)} {line}"))


def doctor_json(trace: Any, loaded: dict[str, Any] | None) -> dict[str, Any]:
    """``cuplug doctor --json``: the trace's own JSON, the variant wheels, and (unless --no-load) the load."""
    doc = trace.to_json()
    doc["variants"] = _variant_rows(trace)
    if loaded is not None:
        doc["loaded"] = {**loaded, "attempts": doc["attempts"]}
    return doc


def _load_for_doctor(backend_name: str) -> tuple[Any, dict[str, Any]]:
    """One decision and its load: (the trace, what loaded: variant, ok, error, info)."""
    from ..runtime import loading

    loaded: dict[str, Any] = {"variant": None, "ok": False, "error": None, "info": None}
    try:
        with loading.load(backend_name) as backend:
            loaded.update(variant=backend.variant, ok=True, info=backend.info())
            return backend.trace, loaded
    except CuplugError as exc:
        trace = getattr(exc, "trace", None)
        if trace is None:  # no decision was made (a ConfigError): nothing to report but the error
            raise
        loaded["error"] = str(exc)
        return trace, loaded


def cmd_new_backend(args: argparse.Namespace) -> int:
    from ..kit import scaffold

    try:
        dest = Path(args.dir or (args.package or args.name)).resolve()
        files = scaffold.create(args.name, dest, args.package)
    except scaffold.ScaffoldError as exc:
        print(f"cuplug new-backend: {_say(str(exc))}", file=sys.stderr)
        return 2
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"cuplug new-backend: cannot write the project: {_say(str(exc))}", file=sys.stderr)
        return 2
    print(f"cuplug new-backend: wrote {len(files)} files into {dest}")
    print(f"  next: cd {dest} && nox -s wheels tests   (builds the CUDA 12/13 variants, the wheels, runs the tests)")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    return _Steps(args.timeout).run(_doctor_body(args))


def _doctor_body(args: argparse.Namespace) -> Any:
    def body(steps: _Steps) -> int:
        from ..runtime import loading

        if args.no_load:
            steps.step = "decide (driver probe)"
            trace = loading.explain(args.backend)
            print(json.dumps(doctor_json(trace, None), indent=2) if args.json else trace.text())
            if not args.json:
                _print_variants(trace)
            return 0
        steps.step = "decide and load"
        trace, loaded = _load_for_doctor(args.backend)
        if args.json:
            print(json.dumps(doctor_json(trace, loaded), indent=2))
            return 0
        print(trace.text())
        _print_variants(trace)
        label = tag(args.backend)
        if not loaded["ok"]:
            print(_say(f"{label} load failed         : {loaded['error']}"))
            return 1
        dev = loaded["info"].get("device") if isinstance(loaded["info"].get("device"), dict) else {}
        mem, free = dev.get("memory_total"), dev.get("memory_free", 0)
        line = f"{label} loaded              : {trace.decision.label} on {dev.get('name')}"
        if isinstance(mem, (int, float)) and mem > 0 and isinstance(free, (int, float)):
            line += f", {free / 2**30:.1f}/{mem / 2**30:.1f} GiB free"
        if dev.get("temperature_c") is not None:
            line += f", {dev['temperature_c']} C"
        print(_say(line))
        return 0

    return body


INSPECT_EXIT_HELP = """exit codes:
   0  every artifact matches its manifest (or has no manifest to compare with)
  15  a mismatch, or a missing or unreadable artifact (artifact-corrupt)
   2  the target is not a .so, a wheel, a directory or an installed backend"""
WARMUP_EXIT_HELP = f"""exit codes:
   0  every usable PTX variant compiled and the JIT cache can keep it
   {EXIT_CACHE_UNUSABLE}  compiled, but the cache is disabled or not writable
  10-14  no GPU to compile for, or no usable PTX variant (as `cuplug probe`)
  16  a PTX variant failed to load"""


def _paint(text: str, ok: bool) -> str:
    """Green/red on a terminal only (and never with NO_COLOR)."""
    if not sys.stdout.isatty() or os.environ.get("NO_COLOR"):
        return text
    return f"\033[{32 if ok else 31}m{text}\033[0m"


def cmd_inspect(args: argparse.Namespace) -> int:
    from . import inspection

    try:
        findings = inspection.inspect_target(args.target)
    except inspection.InspectError as exc:
        print(f"cuplug inspect: {_say(str(exc))}", file=sys.stderr)
        return 2
    bad = [f for f in findings if not f.ok]
    if args.json:
        print(json.dumps({"ok": not bad, "artifacts": [f.to_json() for f in findings]}, indent=2))
    else:
        print(_say(inspection.format_findings(findings)))
        print(_paint(f"cuplug inspect: {len(findings) - len(bad)}/{len(findings)} artifacts match", not bad))
    return reasons.EXIT_CODES[reasons.ARTIFACT_CORRUPT] if bad else 0


def cmd_warmup(args: argparse.Namespace) -> int:
    def body(steps: _Steps) -> int:
        from . import warmup

        steps.step = "warmup (probe, load, JIT)"
        report, code = warmup.run(backend=args.backend)
        print(json.dumps(report, indent=2) if args.json else _say(warmup.format_report(report)))
        return code

    return _Steps(args.timeout).run(body)


class _CMakeDir(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from ..kit.resources import cmake_dir

        print(cmake_dir())
        parser.exit(0)


def _wrapped(text: str) -> str:
    return textwrap.fill(text, 78)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cuplug", description=_wrapped("Find, check and explain cuplug's backends."))
    parser.add_argument("--version", action="version", version=f"cuplug {__version__}")
    parser.add_argument(
        "--cmake-dir",
        action=_CMakeDir,
        nargs=0,
        help="print the directory for -Dcuplug_DIR= (find_package(cuplug)) and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "probe",
        help="load the best backend, run a vector add, check it, exit with a step code",
        description=_wrapped(
            "Load through the normal path, initialize, run a vector add of 2^20+3 "
            "elements, verify it on the host and exit with the code of the first "
            "failing step."
        ),
        epilog=PROBE_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--allow-cpu", action="store_true", help="a correct CPU fallback exits 0")
    p.add_argument(
        "--backend",
        default="vector",
        help="the backend to probe (default vector): every op runs on its declared sample against the CPU twin",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--timeout",
        type=_timeout,
        default=STEP_TIMEOUT,
        help=f"seconds before a hung step is reported ({STEP_TIMEOUT:g})",
    )
    p.set_defaults(func=cmd_probe)
    d = sub.add_parser(
        "doctor",
        help="the diagnostic table: driver, devices, candidates, decision",
        description=_wrapped(
            "Print driver and runtime versions, devices, every installed artifact "
            "accepted or rejected and why, the environment variables that matter, "
            "the decision, and (unless --no-load) the load result."
        ),
    )
    d.add_argument("--json", action="store_true", help=f"one JSON object, schema {DOCTOR_SCHEMA}")
    d.add_argument("--no-load", action="store_true", help="decide only; dlopen nothing")
    d.add_argument(
        "--backend",
        default="vector",
        metavar="NAME",
        help="the backend to diagnose (default: vector, cuplug's own; or any installed one)",
    )
    d.add_argument(
        "--timeout",
        type=_timeout,
        default=STEP_TIMEOUT,
        help=f"seconds before a hung driver is reported ({STEP_TIMEOUT:g}; exit 10)",
    )
    d.set_defaults(func=cmd_doctor)
    nb = sub.add_parser(
        "new-backend",
        help="create a project for a backend of your own, ready to build",
        description=_wrapped(
            "Copy cuplug's example project (a prefix sum: CUDA .cu and CPU .c "
            "behind one op table, CMake, pyproject, noxfile, tests) under a new "
            "name. It builds its CUDA 12/13 variants and wheels and passes its "
            "tests as it is; then replace the op with yours."
        ),
    )
    nb.add_argument("name", help="backend name (cuplug.load(NAME)); lowercase letters, digits, _")
    nb.add_argument("--package", help="Python package name (default: NAME)")
    nb.add_argument("--dir", help="where to write it (default: ./PACKAGE); must not exist or be empty")
    nb.set_defaults(func=cmd_new_backend)
    i = sub.add_parser(
        "inspect",
        help="read the SASS/PTX inside artifacts and check them against the manifest",
        description=_wrapped(
            "Read the SASS and PTX targets and the PTX ISA from the ELF .nv_fatbin "
            "section of each artifact (cuplug's own reader, no dlopen) and compare "
            "them, the size and the sha256 with the manifest."
        ),
        epilog=INSPECT_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    i.add_argument(
        "target",
        nargs="?",
        help="a backend .so, a backend wheel, a directory with manifest.json, or "
        "an installed package (cuda13, cuplug_cuda13); default: all installed",
    )
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(func=cmd_inspect)
    w = sub.add_parser(
        "warmup",
        help="JIT the PTX variant for this GPU into the CUDA compute cache",
        description=_wrapped(
            "Load each usable ptx variant (CUPLUG_BACKEND=<cuda>:ptx), run every op "
            "once so the driver JIT-compiles it for the present GPU into its compute "
            "cache ($CUDA_CACHE_PATH, default ~/.nv/ComputeCache), and report the "
            "first and second launch times and what the cache gained."
        ),
        epilog=WARMUP_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w.add_argument("--json", action="store_true", help="print one JSON object")
    w.add_argument("--backend", default="vector", help="the backend whose ptx variants to warm (default vector)")
    w.add_argument(
        "--timeout", type=_timeout, default=600.0, help="seconds before a hung driver or JIT is reported (600)"
    )
    w.set_defaults(func=cmd_warmup)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CuplugError as exc:
        print(f"cuplug {args.command}: {_say(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # never a traceback from an operator's tool
        print(f"cuplug {args.command}: internal error: {type(exc).__name__}: {_say(str(exc))}", file=sys.stderr)
        return 1
