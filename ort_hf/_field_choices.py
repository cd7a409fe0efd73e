"""Choices declared once, on the dataclass field, and checked from there.

A field's allowed values are its ``metadata["choices"]`` or its ``Literal[...]`` annotation.
HfArgumentParser turns either into argparse choices, so the command line refuses anything else;
:func:`check_choices` refuses it for values given in Python.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable


@functools.cache
def declared_choices(cls: type) -> dict[str, tuple]:
    """Field name -> allowed values, for each field that ``cls`` itself declares with choices."""
    own = vars(cls).get("__annotations__", {})
    hints = typing.get_type_hints(cls)
    found = {}
    for f in dataclasses.fields(cls):
        if f.name not in own:
            continue
        if "choices" in f.metadata:
            found[f.name] = tuple(f.metadata["choices"])
        elif typing.get_origin(hints[f.name]) is typing.Literal:
            found[f.name] = typing.get_args(hints[f.name])
    return found


def check_choices(obj, cls: type, name_of: Callable[[str], str]) -> None:
    """Refuse a value of ``obj`` outside its field's choices (the fields ``cls`` declares), naming
    the field as ``name_of(field name)`` says. A choice matches by value and type: ``"17"`` is not
    ``17``, nor ``1`` ``True``."""
    for name, choices in declared_choices(cls).items():
        value = getattr(obj, name)
        if not any(value == choice and type(value) is type(choice) for choice in choices):
            raise ValueError(f"{name_of(name)} must be one of {', '.join(map(str, choices))}; got {value!r}.")
