"""Config text to values: YAML files (duplicate keys and syntax errors named by file and line), `--set` values, and
each value checked against its field's annotation. Knows nothing of the config's sections.

A config is as untrusted as a corpus (a shared config repository, a copied YAML), and the launchers read it on a
login node: every YAML or JSON document a user hands us is read within bounds (MAX_DOCUMENT_BYTES, MAX_NESTING and
MAX_VALUES counted with aliases expanded, so a 465-byte "billion laughs" is refused in milliseconds, not grown to
gigabytes), and a rejected value is shown cut to a few hundred characters (`shown`)."""

from __future__ import annotations

import dataclasses
import json
import math
import reprlib
from pathlib import Path
from typing import Any

import yaml

MAX_DOCUMENT_BYTES = 1 << 20  # a config is a few kB; an HF config.json tens of kB
MAX_JSON_BYTES = 64 << 20  # a safetensors index of a large checkpoint is a few MB
MAX_NESTING = 32  # a config nests 3 levels (logging.wandb.project)
MAX_VALUES = 100_000  # values of a document once its aliases are expanded
_SHOWN = reprlib.Repr()
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxlevel = 120, 120, 6, 6, 3


def shown(value: Any) -> str:
    """A value for an error message: its repr cut to a few hundred characters (never built in full)."""
    text = _SHOWN.repr(value)
    return text if len(text) <= 300 else text[:297] + "..."


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
    raise ValueError(f"{key} must be {_wanted(kinds)}, got {shown(text)} (--set {key}=...)")


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
        raise ValueError(f"{key} must be a list written [a, b, ...] or a,b,..., got {shown(text)} (--set {key}=...)")
    items = [item.strip() for item in inner.split(",")] if inner.strip() else []
    if any(not item for item in items):
        raise ValueError(f"{key}: an empty element in the list {shown(text)} (--set {key}=...)")
    numbers_only = "float" in str(annotation) or "int" in str(annotation)
    out: list = []
    for item in items:
        number = _parse_number(item)
        if number is None and numbers_only:
            raise ValueError(f"{key} must be a list of numbers, got {shown(item)} in {shown(text)} (--set {key}=...)")
        out.append(item.strip("'\"") if number is None else number)
    return out


def _parse_mapping(key: str, text: str) -> dict:
    """A YAML flow mapping `{project: x, mode: offline}` for a nested section."""
    try:
        value = load_yaml_text(text, f"--set {key}")
    except yaml.YAMLError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be a mapping written {{field: value, ...}}, got {shown(text)} (--set {key}=...)")
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
        got = "nothing (an empty value)" if value is None else f"{shown(value)} ({type(value).__name__})"
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
                    None, None, f"{shown(key)} is given twice (first on line {seen[key] + 1}); keep one",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _check_bounds(node: yaml.Node, source: str) -> None:
    """ValueError unless the document, its aliases expanded, nests at most MAX_NESTING deep and holds at most
    MAX_VALUES values (walked with a stack that stops at the first bound, so a bomb costs MAX_VALUES steps)."""
    stack, count = [(node, 1)], 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ValueError(f"{source}: more than {MAX_VALUES} values once its aliases are expanded (aliases that "
                             "multiply, a 'billion laughs'); write the values out")
        if depth > MAX_NESTING:
            raise ValueError(f"{source}: nested deeper than {MAX_NESTING} levels; a config nests a few")
        if isinstance(node, yaml.MappingNode):
            stack.extend((child, depth + 1) for pair in node.value for child in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)


def load_yaml_text(text: str, source: str) -> Any:
    """One YAML document read within the bounds above (duplicate keys refused); ValueError naming `source`."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{source} is {len(text)} characters, more than a config's {MAX_DOCUMENT_BYTES}; "
                         "is it the right file?")
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_bounds(node, source)
        return loader.construct_document(node)
    except RecursionError:
        raise ValueError(f"{source}: nested deeper than {MAX_NESTING} levels; a config nests a few") from None
    finally:
        loader.dispose()


def read_json(path: Path, what: str) -> Any:
    """A JSON file a user hands us (an HF config.json, an index) read within bounds; ValueError naming it."""
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise ValueError(f"{what} {path} is {size} bytes, more than {MAX_JSON_BYTES}; is it the right file?")
    try:
        value = json.loads(path.read_text())
    except RecursionError:
        raise ValueError(f"{what} {path}: nested too deep to be a {what}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{what} {path} is not valid JSON ({shown(str(error))})") from None
    _check_json_nesting(value, f"{what} {path}")
    return value


def _check_json_nesting(value: Any, source: str) -> None:
    stack = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_NESTING:
            raise ValueError(f"{source}: nested deeper than {MAX_NESTING} levels")
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children)


def read_yaml(path: Path) -> Any:
    """A YAML file's content; a syntax error or a duplicate key is one ValueError naming the file and line."""
    try:
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise ValueError(f"config file {path} is {size} bytes, more than a config's {MAX_DOCUMENT_BYTES}; "
                             "is it the right file?")
        return load_yaml_text(path.read_text(), f"config file {path}")
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ValueError(f"config file {where}: {problem}; fix the YAML there") from None
    except UnicodeDecodeError:
        raise ValueError(f"config file {path} is not UTF-8 text") from None
