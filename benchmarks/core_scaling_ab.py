"""core_scaling of a base revision and of this tree, alternately: the shares side by side.

    python -m benchmarks.core_scaling_ab --base main --times 3      # what benchmarks/results/shm_transport.json holds
    python -m benchmarks.core_scaling_ab --base main --formats blob hdf5 --counts 2   # only these

Each time, ``python -m benchmarks.core_scaling --images N --rounds 1`` runs in a child process,
(with ``--formats`` and ``--counts`` passed on where given), first in ``git archive BASE`` unpacked into a temporary folder, then in this tree, each with
its own tree first on ``PYTHONPATH``; the load average is recorded before each. Prints one JSON
line per run; ``--save FILE`` writes them all.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import run_main

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="main")
    parser.add_argument("--times", type=int, default=3)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--formats", nargs="+", help="passed on to benchmarks.core_scaling")
    parser.add_argument("--counts", nargs="+", help="passed on to benchmarks.core_scaling")
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    log = []
    with tempfile.TemporaryDirectory(prefix="packer-cs-ab-") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.base], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        trees = {"base": base, "this": REPO}
        extra = [*(["--formats", *args.formats] if args.formats else []), *(["--counts", *args.counts] if args.counts else [])]
        for i in range(args.times):
            for side, tree in trees.items():
                out = Path(tmp) / f"{side}-{i}"
                load, start = os.getloadavg(), time.time()
                subprocess.run([sys.executable, "-m", "benchmarks.core_scaling", "--images", str(args.images), "--rounds", "1", "--out", str(out), *extra],
                               cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True, stdout=subprocess.DEVNULL)
                r = json.loads((out / "core_scaling.json").read_text())
                top = str(r["worker_counts"][-1])
                row = {"side": side, "round": i, "load_before": load, "seconds": time.time() - start, "workers": top,
                       "rates": {k: v[top]["median"] for k, v in r["rates"].items()},
                       "shares": {k: v[top]["median"] for k, v in r["shares"].items()}}
                print(json.dumps(row), flush=True)
                log.append(row)
    if args.save:
        args.save.write_text(json.dumps(log, indent=1))


if __name__ == "__main__":
    run_main(main)
