"""Config text to values: YAML files (duplicate keys and syntax errors named by file and line), `--set` values, and
each value checked against its field's annotation. Knows nothing of the config's sections."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml


def parse_value(text: str) -> Any:
    """`--set` values are YAML scalars: 1e-3, true, null, [1, 2] all work."""
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:  # YAML 1.1 reads "3e-4" (no dot) as a string
            return float(value)
        except ValueError:
            return value
    return value


_TYPE_NAMES = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
               "list": "a list", "tuple": "a list", "None": "null"}


def coerce(section: str, spec: dataclasses.Field, value: Any) -> Any:
    """The field's value checked against its annotation (bool is not an int, [2] is not an int, an empty
    `--set x=` is not a number); numbers written as strings ('3e-4' in YAML 1.1) become numbers."""
    kind = str(spec.type)
    alternatives = [a.strip().split("[")[0] for a in kind.split("|")]
    if any(a not in _TYPE_NAMES for a in alternatives):  # a nested section (WandbConfig): checked by its class
        return value
    if value is None and "None" in alternatives:
        return value
    if isinstance(value, str) and ("float" in alternatives or "int" in alternatives) and "str" not in alternatives:
        try:
            return float(value) if "float" in alternatives else int(value)
        except ValueError:
            pass
    if isinstance(value, bool):
        ok = "bool" in alternatives
    elif isinstance(value, int):
        ok = "int" in alternatives or "float" in alternatives
        value = float(value) if ok and "int" not in alternatives else value
    elif isinstance(value, float):
        ok = "float" in alternatives
    elif isinstance(value, str):
        ok = "str" in alternatives
    elif isinstance(value, (list, tuple)):
        ok = "list" in alternatives or "tuple" in alternatives
    else:
        ok = False
    if not ok:
        wanted = " or ".join(dict.fromkeys(_TYPE_NAMES[a] for a in alternatives))
        got = "nothing (an empty value)" if value is None else f"{value!r} ({type(value).__name__})"
        raise ValueError(f"{section}.{spec.name} must be {wanted}, got {got}")
    return value


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice (first on line {seen[key] + 1}); keep one", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> Any:
    """A YAML file's content; a syntax error or a duplicate key is one ValueError naming the file and line."""
    try:
        return yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ValueError(f"config file {where}: {problem}; fix the YAML there") from None
    except UnicodeDecodeError:
        raise ValueError(f"config file {path} is not UTF-8 text") from None
