"""tests/protections_table.py against the tree: every entry's break still applies (its find string occurs exactly
once in the file it names) and every test it names exists, so a refactor that moves a protection fails here, naming
the entry, rather than at the table's next run (STALE) or, worse, in a break that no longer breaks anything."""

import protections


def test_every_entrys_find_string_occurs_exactly_once_in_its_file():
    stale = {entry.name: why for entry in protections.TABLE if (why := protections.stale_reason(entry))}
    assert not stale, f"tests/protections.py entries to move with their code: {stale}"


def test_every_test_an_entry_names_exists():
    for entry in protections.TABLE:
        assert entry.tests, f"{entry.name}: names no test"
        for node in entry.tests:
            path, _, rest = node.partition("::")
            source = protections.REPO / path
            assert source.is_file(), f"{entry.name}: {path} does not exist"
            function = rest.split("[")[0].split("::")[-1]
            assert not function or f"def {function}(" in source.read_text(), f"{entry.name}: no {node}"


def test_entries_have_unique_names_a_real_break_and_one_row_each_in_the_list():
    names = [entry.name for entry in protections.TABLE]
    assert len(set(names)) == len(names), sorted(name for name in names if names.count(name) > 1)
    assert all(entry.find != entry.replace for entry in protections.TABLE)
    assert len(protections.markdown().splitlines()) == len(protections.TABLE) + 2
