"""benchmarks/README.md is an index of stored results, and this module specifies what keeps it one.

Every table in the index has the four columns `| measured | result | stored file | command |`. A row's stored file
is one backticked path relative to the repository root, or "—" when the measurement has no stored log (a GPU command
not yet run, a number the notebook kept without its output). The index stays short (at most 250 lines); every stored
file it names exists; every number quoted in a result cell occurs verbatim in the file its row names (with the minus
sign '−' read as '-'), so the index cannot drift from what was measured; a row without a stored file quotes no
number; every row names the command that produced it, and that command is one of the project's own; every notes file
the index links to exists, with the heading the link points at.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT / "benchmarks" / "README.md"
HEADER = "| measured | result | stored file | command |"
SEPARATOR = "|---|---|---|---|"
NO_FILE = "—"
MAX_LINES = 250
NUMBER = re.compile(r"[-−]?\d+(?:\.\d+)?%?")
CODE = re.compile(r"`([^`]+)`")
NOTES_LINK = re.compile(r"\]\((results/[^)#\s]+)(?:#([^)\s]+))?\)")
COMMAND_PREFIXES = ("python -m pretrain", ".venv/bin/python", "python benchmarks/", "bash benchmarks/",
                    "python -m data_prep", "make")
BINARY_SUFFIXES = {".png", ".jpg", ".gz", ".bin", ".idx", ".pt"}


def _tables():
    """Each markdown table of the index as a list of (line number, line), header first."""
    tables, current = [], []
    for number, line in enumerate(INDEX.read_text().splitlines(), start=1):
        if line.startswith("|"):
            current.append((number, line))
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def _cells(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _rows():
    """(name, measured, result, stored file cell, command cell) of every data row of every index table."""
    rows = []
    for table in _tables():
        for number, line in table[2:]:
            cells = _cells(line)
            assert len(cells) == 4, f"benchmarks/README.md:{number} has {len(cells)} cells, not 4: {line[:80]!r}"
            rows.append((f"benchmarks/README.md:{number} ({cells[0][:70]!r})", *cells))
    assert rows, "benchmarks/README.md has no index rows"
    return rows


def _stored_file(name, cell):
    """The path a stored-file cell names, or None for "—"."""
    if cell == NO_FILE:
        return None
    paths = CODE.findall(cell)
    assert len(paths) == 1 and cell == f"`{paths[0]}`", (
        f"{name}: the stored file cell must be one backticked path or {NO_FILE!r}, not {cell!r}")
    return paths[0]


def _slug(heading):
    """The anchor GitHub gives a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_index_is_at_most_250_lines():
    lines = len(INDEX.read_text().splitlines())
    assert lines <= MAX_LINES, f"benchmarks/README.md has {lines} lines; an index keeps to {MAX_LINES}"


def test_every_table_has_the_four_column_header_and_a_separator():
    for table in _tables():
        (first, header), (_, separator) = table[0], table[1]
        assert header.strip() == HEADER, f"benchmarks/README.md:{first}: a table's header must be {HEADER!r}"
        assert separator.strip() == SEPARATOR, f"benchmarks/README.md:{first + 1}: expected {SEPARATOR!r}"


def test_every_row_has_four_non_empty_cells():
    for name, measured, result, stored, command in _rows():
        assert measured and result and stored and command, f"{name}: an empty cell"


def test_every_stored_file_a_row_names_exists():
    for name, _, _, stored, _ in _rows():
        path = _stored_file(name, stored)
        if path is not None:
            assert (ROOT / path).is_file(), f"{name}: the stored file {path} does not exist"


def test_every_number_in_a_result_cell_occurs_in_the_stored_file_its_row_names():
    for name, _, result, stored, _ in _rows():
        path = _stored_file(name, stored)
        if path is None or Path(path).suffix in BINARY_SUFFIXES or not (ROOT / path).is_file():
            continue
        text = (ROOT / path).read_text(encoding="utf-8", errors="replace").replace("−", "-")
        missing = [n for n in NUMBER.findall(result.replace("−", "-")) if n not in text]
        assert not missing, f"{name}: {missing} not in {path}"


def test_a_row_without_a_stored_file_quotes_no_number():
    for name, _, result, stored, _ in _rows():
        if _stored_file(name, stored) is None:
            assert not NUMBER.findall(result), f"{name}: a number without a stored file: {result!r}"


def test_every_row_names_a_command():
    for name, _, _, _, command in _rows():
        assert CODE.findall(command), f"{name}: no backticked command in {command!r}"


def test_every_command_is_a_project_command():
    for name, _, _, _, command in _rows():
        for each in CODE.findall(command):
            assert each.startswith(COMMAND_PREFIXES), f"{name}: {each!r} starts with none of {COMMAND_PREFIXES}"


def test_every_notes_link_points_to_an_existing_file_and_heading():
    links = NOTES_LINK.findall(INDEX.read_text())
    assert links, "benchmarks/README.md links no notes file"
    for target, anchor in links:
        path = INDEX.parent / target
        assert path.is_file(), f"benchmarks/README.md links {target}, which does not exist"
        if anchor:
            headings = {_slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}
            assert anchor in headings, f"benchmarks/README.md links {target}#{anchor}: no such heading"
