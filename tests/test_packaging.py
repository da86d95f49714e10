"""What `pip install` builds from setup.cfg: every shipped data directory is a declared package."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_package_data_directory_is_a_declared_package_so_install_warns_nothing(monkeypatch):
    # setuptools (build_py) warns at install about a data directory its package finder did not list.
    from setuptools.config.setupcfg import read_configuration

    monkeypatch.chdir(REPO)  # the finder resolves setup.cfg's paths from the working directory
    options = read_configuration(str(REPO / "setup.cfg"))["options"]
    packages = set(options["packages"])
    for package, patterns in options["package_data"].items():
        for pattern in patterns:
            directory = Path(pattern).parent
            if str(directory) != ".":
                assert ".".join((package, *directory.parts)) in packages, (package, pattern)
    assert not any("__pycache__" in package for package in packages)
