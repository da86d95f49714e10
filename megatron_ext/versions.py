"""The megatron-core versions this project is tested on, and the one switch between them.

setup.cfg's requirement, the Makefile's second test environment and `constraints-cpu.txt`
all name these versions; tests/test_versions.py keeps them equal to the constants here.
Pure metadata: importing this module does not import megatron.core.
"""

from __future__ import annotations

from importlib import metadata

from packaging.version import Version

# Both ends run the whole suite in `make test` (the newest in a second virtual environment).
TESTED_MEGATRON_CORE = ("0.16.1", "0.19.2")
# The requirement setup.cfg states: from the oldest tested release up to the next minor after the newest.
MEGATRON_CORE_REQUIREMENT = ">=0.16.1,<0.20"


def megatron_core_version() -> Version | None:
    """The installed megatron-core's version, or None when it is not installed."""
    try:
        return Version(metadata.version("megatron-core"))
    except metadata.PackageNotFoundError:
        return None


def megatron_core_at_least(version: str) -> bool:
    """True when the installed megatron-core is `version` or newer (a local build's suffix is ignored)."""
    installed = megatron_core_version()
    return installed is not None and Version(installed.base_version) >= Version(version)


def in_tested_range(version: Version | None = None) -> bool:
    """True when `version` (default: the installed one) lies within MEGATRON_CORE_REQUIREMENT."""
    from packaging.specifiers import SpecifierSet

    version = version if version is not None else megatron_core_version()
    return version is not None and SpecifierSet(MEGATRON_CORE_REQUIREMENT).contains(version, prereleases=True)
