"""What linking an LTO variant costs the host, without a GPU (issue 33 part 3, docs/lto.md): the kit builds
`vector`'s LTO variant (packaging/hopper.json's "lto") with the pinned CUDA 12 and 13 toolchains, and the pinned
nvJitLink of each major (toolchains/nvjitlink.txt) links it for several GPUs, each link from an empty cache, then
once more from the cache. Median and spread of ROUNDS links per (major, SM).

    python bench/lto_link.py [ROUNDS] > lto-link.json      (a venv with cuplug installed; ~1 min)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from suite import stats  # bench/suite: the one summary shape of every measurement

ROOT = Path(__file__).resolve().parents[1]
ARCHS = {"cuda13": (90, 100, 120, 87, 86), "cuda12": (90, 87, 86)}


def main() -> int:
    from cuplug.contract import manifest
    from cuplug.kit import toolchain
    from cuplug.runtime import jitlink

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    site = toolchain.install_nvjitlink(lambda _msg: None)
    matrix = json.loads((ROOT / "packaging" / "hopper.json").read_text())
    matrix["variants"] = {"lto": matrix["variants"]["lto"]}
    doc: dict = {"command": f"python bench/lto_link.py {rounds}", "rounds": rounds, "links": {}}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "lto.json").write_text(json.dumps(matrix))
        for major, archs in ARCHS.items():
            out = Path(tmp) / major
            subprocess.run(
                [sys.executable, "-m", "cuplug.kit", "variants", "--cuda", major, "--source", str(ROOT / "backends"),
                 "--out", str(out), "--backend", "vector", "--matrix", str(Path(tmp) / "lto.json")],
                check=True, capture_output=True,
            )  # fmt: skip
            (art,) = manifest.read_strict(out, major)
            found = jitlink.find(int(major[4:]), path=[str(site)], env={})
            assert found is not None
            for arch in archs:
                times = []
                for r in range(rounds):
                    os.environ["CUPLUG_CACHE_DIR"] = str(Path(tmp) / f"cache-{major}-{arch}-{r}")
                    linked, _ = jitlink.image_for(str(out / art.file), "k", arch, found)
                    times.append(linked.ms)
                t0 = time.perf_counter()
                cached, _ = jitlink.image_for(str(out / art.file), "k", arch, found)
                cached_ms = (time.perf_counter() - t0) * 1e3
                assert cached.cached
                doc["links"][f"{major}/sm_{arch}"] = {
                    "nvjitlink": found.full,
                    "artifact_bytes": art.size,
                    "image_bytes": os.path.getsize(cached.path),
                    "link_ms": stats.summary(times, "ms"),
                    "cached_lookup_ms": round(cached_ms, 3),
                }  # fmt: skip
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
