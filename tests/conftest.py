import sys, pathlib; sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def pytest_collection_modifyitems(config, items):
    """Files with tests that load the real model run first. Under pytest-xdist's
    ``--dist loadfile`` (the README's test command) whole files go to the cores in
    this order: the long files start at once and the short ones fill in beside
    them, instead of a long file starting last and running alone. Tests keep their
    order within a file (a stable sort on a per-file key)."""
    heavy = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in heavy)
