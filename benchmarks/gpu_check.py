"""`make gpu-check`: every GPU figure the issues ask for, from ONE GPU, in one command.

    python3 benchmarks/gpu_check.py --device cuda --out results/gpu-check     # one NVIDIA or AMD GPU
    python3 benchmarks/gpu_check.py --device cpu --smoke --out /tmp/gc        # the same path on a CPU (the test)

One fresh process per rung (a clean allocator each), the targets reported and never asserted, the
time budget shared between the sections: docs/performance.md, "make gpu-check", says what runs and
why. The parts are in benchmarks/gpucheck/. This driver imports no torch: the GPU belongs to the rungs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, for gpucheck (also when loaded by path)

try:
    from gpucheck.runner import Check, parse_args
except ImportError as e:  # e.g. a .whl/ built before the tree's helpers (scaleladder.markdown, gitinfo) existed
    sys.exit(f"gpu-check: {e}: run it with scaleladder importable, and `make gpu-wheels` again if .whl/ is older "
             "than this tree")


def main(argv: list[str] | None = None) -> int:
    return Check(parse_args(argv, __doc__.split("\n\n")[0] if __doc__ else "")).run()


if __name__ == "__main__":
    sys.exit(main())
