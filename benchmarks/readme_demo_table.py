"""The README's demo table, generated from the stored demo result (benchmarks/results/demo_cpu-small_seed42.md).

`make demo` prints the table of its report; that report is stored as the file above (with the command and the
machine's load), and this script copies its table between the README's demo-table markers. tests/test_readme.py
checks that the two are equal.

    make demo && cp demo_out/report.md ... (see the stored file's first lines)
    python benchmarks/readme_demo_table.py --write
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STORED = REPO / "benchmarks" / "results" / "demo_cpu-small_seed42.md"
README = REPO / "README.md"
START = "<!-- demo-table: generated from benchmarks/results/demo_cpu-small_seed42.md -->"
END = "<!-- /demo-table -->"


def stored_table(path: Path = STORED) -> str:
    """The report's results table (the block `make demo` prints last), as its lines."""
    blocks = path.read_text().split("\n\n")
    return next(block.strip() for block in blocks if block.lstrip().startswith("| Method"))


def readme_table(text: str) -> str:
    """The README's block between the demo-table markers."""
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def main() -> int:
    """Print the stored table, or write it into the README (--write)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="replace the README's table by the stored one")
    args = parser.parse_args()
    table = stored_table()
    if not args.write:
        print(table)
        return 0
    text = README.read_text()
    before, rest = text.split(START, 1)
    README.write_text(f"{before}{START}\n{table}\n{END}{rest.split(END, 1)[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
