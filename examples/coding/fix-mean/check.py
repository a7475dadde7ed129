"""The fix-mean task's check: `python check.py REPO` exits 0 when REPO/stats.py's mean() is right."""

import importlib.util
import sys
from pathlib import Path

CASES = [([1, 2, 3], 2), ([4], 4), ([-1, 1], 0), ([0.5, 1.5, 2.5, 3.5], 2)]


def main(repo: Path) -> int:
    spec = importlib.util.spec_from_file_location("stats", repo / "stats.py")
    if spec is None or spec.loader is None:
        print("no stats.py")
        return 1
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        failures = [(values, want, got) for values, want in CASES if (got := module.mean(values)) != want]
    except Exception as error:  # the agent's code may raise anything: that is a failed check
        print(f"stats.py raised {type(error).__name__}: {error}")
        return 1
    for values, want, got in failures:
        print(f"mean({values}) = {got!r}, expected {want!r}")
    print("ok" if not failures else f"{len(failures)} of {len(CASES)} cases failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
