"""Every settings section's options have their help: the docstring under each field, in the ``Attributes:`` block
that ``--help`` reads."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_grpo.settings import SECTIONS


@pytest.mark.parametrize("kind", SECTIONS.values(), ids=SECTIONS)
def test_every_section_option_has_help(kind):  # under the field (docstrings.field_help), or in an Attributes: block
    documented = kind.__doc__.split("Attributes:")[1]
    for field in dataclasses.fields(kind):
        assert f"        {field.name}: " in documented, f"{kind.__name__}.{field.name} has no help text"
