"""``laggard.integrations`` exposes its public names lazily, and each one resolves."""

import pytest

import laggard.integrations as integrations


@pytest.mark.parametrize("name", integrations.__all__)
def test_every_exported_name_resolves(name):
    try:
        value = getattr(integrations, name)
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        pytest.skip(f"{name} needs torch (pip install 'laggard[torch]')")
    assert value is not None


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError):
        integrations.NoSuchThing  # noqa: B018
