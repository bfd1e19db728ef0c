#!/usr/bin/env python3
"""The module layering of src/: every #include between folders goes downwards.

Each folder of src/ is a module with a rank; a file may include its own module and modules of
lower rank, never one of equal or higher rank, and never an edge listed in FORBIDDEN. A folder
missing from RANKS is an error too, so a new module states its place here. The ranks mirror the
library graph of src/CMakeLists.txt (docs/model.md, "Where a mode lives").

Usage: check_layers.py SRC_DIR   (exit 0: no violation; 1: violations, each printed as file:line)
"""
import pathlib
import re
import sys

RANKS = {
    "util": 0,
    "kernels": 1, "data": 1, "dist": 1,
    "model": 2,
    "optim": 3, "results": 3,          # results keeps the model's depth diagnostics
    "cuda": 4, "analysis": 4,          # analysis: statistics and reports over results/
    "train": 5,
    "experiment": 6, "bench": 6,
    "cli": 7,
}
# Allowed by rank but not by design: the experiment reaches the kernels only through model/.
FORBIDDEN = {("experiment", "kernels"), ("experiment", "cuda")}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')


def violations(src: pathlib.Path):
    out = []
    for folder in sorted(p for p in src.iterdir() if p.is_dir()):
        module = folder.name
        if module not in RANKS:
            out.append(f"{folder}: module '{module}' has no rank in tests/layering/check_layers.py")
            continue
        for path in sorted(folder.rglob("*")):
            if path.suffix not in {".hpp", ".cpp", ".cu", ".cuh", ".h"}:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m or m.group(1) == module:
                    continue
                target = m.group(1)
                if target not in RANKS:
                    continue  # not a module of src/ (a system or third-party header)
                if (module, target) in FORBIDDEN:
                    out.append(f"{path}:{number}: {module} must not include {target} ({line.strip()})")
                elif RANKS[target] >= RANKS[module]:
                    out.append(f"{path}:{number}: {module} (rank {RANKS[module]}) includes {target} "
                               f"(rank {RANKS[target]}), which is not below it ({line.strip()})")
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    found = violations(pathlib.Path(sys.argv[1]))
    for v in found:
        print(v)
    print(f"check_layers: {len(found)} violation(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
