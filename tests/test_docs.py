"""README and docs/: the config reference equals the dataclasses, the README keeps its two set-up commands,
and every file it points to exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_config_reference_in_docs_equals_the_dataclasses():
    from pretrain.experiments.config_reference import DOC, render

    assert DOC.read_text() == render(), "docs/config.md is stale: python -m pretrain.experiments.config_reference"


def test_readme_set_up_is_exactly_make_demo_and_make_test():
    section = README.split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in block.splitlines()] == ["make demo", "make test"]


def test_every_path_the_readme_names_exists():
    named = set(re.findall(r"\b((?:docs|benchmarks|slurm|pretrain|tests)/[\w./-]+\.(?:md|png|py|sh|yaml))", README))
    named |= {m for m in re.findall(r"\]\(([^)]+)\)", README) if not m.startswith("http")}
    missing = sorted(n for n in named if "<" not in n and not (ROOT / n).exists())
    assert not missing, f"README names files that do not exist: {missing}"


def test_no_doc_installs_a_package_no_index_has():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        assert "posaug-megatron[" not in path.read_text(), f"{path}: install extras from the checkout (pip install -e)"


def test_the_license_setup_cfg_names_is_there():
    assert "license = Apache-2.0" in (ROOT / "setup.cfg").read_text()
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
