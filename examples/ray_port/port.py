"""Port a Ray Train script to Cairn by rewriting its imports, and only its imports.

python examples/ray_port/port.py train_ray.py > train_cairn.py
"""

from __future__ import annotations

import sys

IMPORTS = {
    "from ray import train": "import cairn as train",
    "from ray.train import ": "from cairn import ",
    "from ray.train.torch import ": "from cairn.torch import ",
}


def port(source: str) -> str:
    """The script with every Ray Train import line replaced by Cairn's; nothing else."""
    lines = []
    for line in source.splitlines(keepends=True):
        for ray_import, cairn_import in IMPORTS.items():
            if line.startswith(ray_import):
                line = cairn_import + line[len(ray_import):]
                break
        lines.append(line)
    return "".join(lines)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.stdout.write(port(f.read()))
