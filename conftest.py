"""Root conftest: plugins for every test path, notebooks included (see tests/nb_streams.py)."""

pytest_plugins = ["tests.nb_streams"]
