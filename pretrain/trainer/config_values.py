"""Config text to values: YAML files (duplicate keys and syntax errors named by file and line), `--set` values, and
each value checked against its field's annotation. Knows nothing of the config's sections."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import yaml


_NULLS = ("", "null", "Null", "NULL", "~")
_TRUE, _FALSE = ("true", "yes", "on"), ("false", "no", "off")


def alternatives(annotation: Any) -> list[str]:
    """The type names a field's annotation allows: 'int | None' -> ['int', 'None']."""
    return [a.strip().split("[")[0] for a in str(annotation).split("|")]


def parse_value(key: str, annotation: Any, text: str) -> Any:
    """A `--set KEY=TEXT` value read by its field's type, not as free YAML: a string field takes TEXT as it is
    (`@data/owt`, `#x`, `!x` stay strings), numbers and booleans are parsed, null/~/empty is None where the
    field allows it, a list field reads `[a, b]` or `a,b`, a mapping field a YAML flow mapping `{k: v}`.
    An unreadable value is one ValueError naming the key and the type."""
    kinds = alternatives(annotation)
    stripped = text.strip()
    if "None" in kinds and stripped in _NULLS:
        return None
    if not stripped:
        return None  # coerce names it: "got nothing (an empty value)"
    if "list" in kinds or "tuple" in kinds:
        if stripped.startswith("[") or "str" not in kinds:
            return _parse_list(key, annotation, stripped)
    if "str" in kinds and not {"int", "float"} & set(kinds):
        return text
    if "bool" in kinds and stripped.lower() in _TRUE + _FALSE:
        return stripped.lower() in _TRUE
    if "int" in kinds:
        number = _parse_number(stripped)
        if isinstance(number, int) or (isinstance(number, float) and number.is_integer()):
            return int(number)
    if "float" in kinds:
        number = _parse_number(stripped)
        if number is not None:
            return float(number)
    if "str" in kinds:  # a number or a word (schedule.micro_batch_size: 4 or auto)
        return text
    if any(k not in _TYPE_NAMES for k in kinds) and stripped.startswith("{"):  # a nested section
        return _parse_mapping(key, stripped)
    raise ValueError(f"{key} must be {_wanted(kinds)}, got {text!r} (--set {key}=...)")


def _parse_number(text: str) -> int | float | None:
    """An int or float written as Python reads it (1000, 1_000, 3e-4, 1e9), else None."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return None


def _parse_list(key: str, annotation: Any, text: str) -> list:
    """`[a, b]` or `a,b`: elements typed by the annotation (tuple[float, ...]: numbers; list: numbers where
    they read as one, else strings, as Megatron's --data-path blend [weight, prefix, ...])."""
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if text.startswith("[") != text.endswith("]"):
        raise ValueError(f"{key} must be a list written [a, b, ...] or a,b,..., got {text!r} (--set {key}=...)")
    items = [item.strip() for item in inner.split(",")] if inner.strip() else []
    if any(not item for item in items):
        raise ValueError(f"{key}: an empty element in the list {text!r} (--set {key}=...)")
    numbers_only = "float" in str(annotation) or "int" in str(annotation)
    out: list = []
    for item in items:
        number = _parse_number(item)
        if number is None and numbers_only:
            raise ValueError(f"{key} must be a list of numbers, got {item!r} in {text!r} (--set {key}=...)")
        out.append(item.strip("'\"") if number is None else number)
    return out


def _parse_mapping(key: str, text: str) -> dict:
    """A YAML flow mapping `{project: x, mode: offline}` for a nested section."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be a mapping written {{field: value, ...}}, got {text!r} (--set {key}=...)")
    return value


def _wanted(kinds: list[str]) -> str:
    """'an integer or null' for ['int', 'None']."""
    return " or ".join(dict.fromkeys(_TYPE_NAMES.get(k, "a mapping") for k in kinds))


_TYPE_NAMES = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
               "list": "a list", "tuple": "a list", "None": "null"}


def coerce(section: str, spec: dataclasses.Field, value: Any) -> Any:
    """The field's value checked against its annotation (bool is not an int, [2] is not an int, an empty
    `--set x=` is not a number, nan and inf are no number a field can use); numbers written as strings ('3e-4'
    in YAML 1.1) become numbers."""
    kinds = alternatives(spec.type)
    if any(k not in _TYPE_NAMES for k in kinds):  # a nested section (WandbConfig): checked by its class
        return value
    if value is None and "None" in kinds:
        return value
    if isinstance(value, str) and ("float" in kinds or "int" in kinds) and "str" not in kinds:
        number = _parse_number(value.strip())
        if number is not None:
            value = float(number) if "float" in kinds else number
    if isinstance(value, bool):
        ok = "bool" in kinds
    elif isinstance(value, int):
        ok = "int" in kinds or "float" in kinds
        value = float(value) if ok and "int" not in kinds else value
    elif isinstance(value, float):
        ok = "float" in kinds
        if ok and not math.isfinite(value):
            raise ValueError(f"{section}.{spec.name} must be a finite number, got {value}")
    elif isinstance(value, str):
        ok = "str" in kinds
    elif isinstance(value, (list, tuple)):
        ok = "list" in kinds or "tuple" in kinds
    else:
        ok = False
    if not ok:
        got = "nothing (an empty value)" if value is None else f"{value!r} ({type(value).__name__})"
        raise ValueError(f"{section}.{spec.name} must be {_wanted(kinds)}, got {got}")
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
