"""One command-line grammar for `python -m pretrain`, `python -m data_prep` and the launchers.

Every parser is a `Parser`: its help shows each option's default, and its subcommands inherit the same
class. The shared flags are made here so that they mean the same thing everywhere:
- `--set KEY=VALUE`: repeatable (and several per flag); every value is appended, none is dropped.
- `--seeds 42,137` is a list of seed values; `--num-seeds 2` a count (the first of SEED_ORDER). A lone
  small integer given to `--seeds` looks like a count and is refused with a hint.
- One name per thing: `--output` for what a command writes, the run (or model) as a positional argument,
  `--input` for a corpus. A former spelling stays as a hidden alias (`Parser.add_deprecated`) that works and
  prints one deprecation line naming the current one.
This module imports nothing heavy: `--help` must not import torch.
"""

from __future__ import annotations

import argparse
import re
from typing import NoReturn, Sequence

# The seeds `--num-seeds N` takes, in order: the paper's three, then 1, 2, ...
SEED_ORDER = (42, 137, 2024, *range(1, 100))
# A single `--seeds` value below this reads as a count (`--seeds 2` meant two seeds): refused with a hint.
COUNT_LIKE_BELOW = 10


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions kept as written; every option's help ends with its default (when it has one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or "default" in text or default in (None, False, argparse.SUPPRESS) or default == []
                or not action.option_strings):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else "%(default)s"
        return f"{text} (default: {shown})" if text else f"(default: {shown})"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser with the house help format; subparsers are Parsers too."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        """As ArgumentParser's; an option given without help still shows its default."""
        if "help" not in kwargs and kwargs.get("default") not in (None, False, [], argparse.SUPPRESS):
            kwargs["help"] = "(default: %(default)s)"
        return super().add_argument(*args, **kwargs)

    def add_deprecated(self, old: str, dest: str, instead: str) -> argparse.Action:
        """A former spelling `old` of the option (or positional) stored in `dest`: hidden from --help, it works
        and prints one line naming `instead`."""
        return super().add_argument(old, dest=dest, action=_Deprecated, instead=instead, help=argparse.SUPPRESS,
                                    default=argparse.SUPPRESS)

    def error(self, message: str) -> NoReturn:
        """Exit 2 with one line; an unknown subcommand reads `unknown command X; choose from ...`."""
        match = re.fullmatch(r"argument (?:command|\{[^}]*\}): invalid choice: '(.*)' \(choose from (.*)\)", message)
        if match:
            # Python <= 3.12.7 quotes each choice ('run', 'all'); 3.12.8+ and 3.13 do not (run, all)
            choices = [choice.strip().strip("'") for choice in match.group(2).split(",")]
            message = unknown_choice("command", match.group(1), choices)
        super().error(message)


class _Deprecated(argparse.Action):
    """Stores like `store` and says, once per use on stderr, which spelling replaces the one given."""

    def __init__(self, option_strings, dest, instead: str, **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.instead = instead

    said: set[tuple[str, str]] = set()  # `python -m pretrain` parses a command's line twice: say it once

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        import sys

        if (parser.prog, option_string) not in self.said:
            self.said.add((parser.prog, option_string))
            print(f"{parser.prog}: {option_string} is deprecated; use {self.instead}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_set(parser: argparse.ArgumentParser, dest: str = "set", help: str = "config override") -> None:
    """`--set KEY=VALUE`: repeatable, several values per flag allowed, every value kept in order."""
    parser.add_argument("--set", dest=dest, action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help=f"{help}, e.g. --set optimizer.lr=3e-4 (repeatable; all are applied, in order)")


def seed_list(text: str) -> list[int]:
    """argparse `type` of `--seeds`: comma-separated seed values; a lone small integer is refused as count-like."""
    try:
        seeds = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated seed values, e.g. --seeds 42,137; "
                                         f"got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("empty: give seed values, e.g. --seeds 42,137")
    if "," not in text and 0 <= seeds[0] < COUNT_LIKE_BELOW:
        n = seeds[0]
        raise argparse.ArgumentTypeError(
            f"{n} looks like a count: write --num-seeds {n} for {n} seed(s) "
            f"({', '.join(map(str, SEED_ORDER[:max(n, 1)][:3]))}{', ...' if n > 3 else ''}), "
            f"or --seeds {n}, (trailing comma) for the single seed {n}")
    return seeds


def existing_input(text: str) -> str:
    """An input path that exists, checked at parsing so that a command refuses it before writing anything."""
    from pathlib import Path

    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist: give a JSONL or text file, or a directory of them")
    return text


def add_seeds(parser: argparse.ArgumentParser, default_count: int | None = 1) -> None:
    """`--seeds 42,137` (values) and `--num-seeds N` (a count), mutually exclusive."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--seeds", type=seed_list, nargs="+", metavar="SEED[,SEED...]",
                       help="seed values, e.g. --seeds 42,137 (a list, not a count: see --num-seeds)")
    first = ", ".join(map(str, SEED_ORDER[:3]))
    group.add_argument("--num-seeds", type=int, default=default_count, metavar="N",
                       help=f"number of seeds, taken in the order {first}, 1, 2, ...")


def seeds_of(args: argparse.Namespace, flag_default: Sequence[int] | None = None) -> list[int]:
    """The seed values `--seeds` / `--num-seeds` ask for; ValueError (one line, with a hint) otherwise."""
    if args.seeds:
        seeds = [s for group in args.seeds for s in group]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"--seeds {','.join(map(str, seeds))}: a seed appears twice")
        return seeds
    if args.num_seeds is None:
        if flag_default is None:
            raise ValueError("give --seeds 42,137 or --num-seeds N")
        return list(flag_default)
    if not 1 <= args.num_seeds <= len(SEED_ORDER):
        raise ValueError(f"--num-seeds {args.num_seeds}: expected 1 to {len(SEED_ORDER)}")
    return list(SEED_ORDER[: args.num_seeds])


def unknown_choice(kind: str, name: str, choices: Sequence[str]) -> str:
    """The one-line refusal of an unknown command/subcommand/suite, naming the choices."""
    return f"unknown {kind} {name}; choose from {', '.join(choices)}"


def add_config(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """CONFIG as a positional or `--config`: a YAML path or a shipped name such as 113m_posaug."""
    text = "YAML config, or a shipped config by name such as 113m_posaug (pretrain/configs/)"
    parser.add_argument("config", nargs="?", help=text)
    parser.add_argument("--config", dest="config_flag", metavar="CONFIG", help="the same as the positional CONFIG")


def config_of(args: argparse.Namespace) -> str | None:
    """The config path CONFIG / --config name (a shipped name resolves to pretrain/configs/<name>.yaml)."""
    from pathlib import Path

    if args.config and args.config_flag and args.config != args.config_flag:
        raise ValueError(f"two configs given ({args.config} and --config {args.config_flag}): give one")
    name = args.config or args.config_flag
    if name is None:
        return None
    shipped = Path(__file__).resolve().parent / "configs" / f"{name}.yaml"
    return str(shipped) if not Path(name).is_file() and shipped.is_file() else name
