"""`python -m pretrain export-gguf RUN --output DIR`: our checkpoint -> Hugging Face export (DIR/hf, export-hf's
code) -> GGUF (DIR/model-TYPE.gguf) by llama.cpp's own converter -> checked against transformers.

The converter is llama.cpp's (`convert_hf_to_gguf.py` and its `conversion` package, from a llama.cpp source tree:
--llama-cpp / $LLAMA_CPP_DIR), called as a library the way its main() calls it, so that a byte-level BPE tokenizer
the converter's hash table cannot know gets its pre-tokenizer named explicitly (pretrain.hf.gguf_support). What
llama.cpp cannot run as transformers does is refused before any weight is read (gguf_support.check_llama_cpp_runs).
The check (pretrain.hf.gguf_check) runs the GGUF in llama.cpp (llama-cpp-python) and the HF export in transformers
on the same ids, inside the window and out to 8 windows, and fails in one line past the GGUF type's tolerance.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

from pretrain.hf.gguf_support import (byte_level_pre_tokenizer, check_llama_cpp_runs, check_tokenizer_runs,
                                      converter_dir)

__all__ = ["convert_to_gguf", "export_gguf", "export_gguf_cli", "gguf_name"]


def gguf_name(gguf_type: str) -> str:
    """The GGUF's file name inside export-gguf's output directory."""
    return f"model-{gguf_type}.gguf"


def _named_pre_tokenizer(own, hf_dir: Path):
    """The converter's get_vocab_base_pre, falling back to our explicit name where its hash table knows no match."""

    def pre_tokenizer(tokenizer) -> str:
        try:
            return own(tokenizer)
        except NotImplementedError:  # "BPE pre-tokenizer was not recognized": a newly trained vocabulary
            return byte_level_pre_tokenizer(json.loads((hf_dir / "tokenizer.json").read_text()))

    return pre_tokenizer


def _special_tokens_added(hf_dir: Path) -> tuple[bool, bool]:
    """(BOS, EOS): whether transformers' tokenizer of the export adds them to a text (ours add neither: data_prep
    encodes documents without them)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    plain, full = (tokenizer.encode("a b", add_special_tokens=special) for special in (False, True))
    return full[:1] != plain[:1], full[-1:] != plain[-1:]


def _with_special_token_flags(own_set_vocab, writer, hf_dir: Path, keys):
    """The converter's set_vocab, then tokenizer.ggml.add_bos/eos_token as transformers adds them: without the keys
    llama.cpp adds its own default (a BOS for SentencePiece), a token our models never saw."""

    def set_vocab() -> None:
        own_set_vocab()
        for key, added in zip((keys.ADD_BOS, keys.ADD_EOS), _special_tokens_added(hf_dir)):
            writer.remove_key(key)
            writer.add_bool(key, added)

    return set_vocab


def convert_to_gguf(hf_dir: str | Path, gguf_path: str | Path, gguf_type: str = "f32",
                    llama_cpp: str | Path | None = None) -> Path:
    """Write `gguf_path` from an HF export with llama.cpp's converter (its classes, as its main() builds them)."""
    import torch

    tree = converter_dir(llama_cpp)
    if str(tree) not in sys.path:
        sys.path.append(str(tree))  # its `conversion` package (appended: nothing of ours is shadowed)
    from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

    import gguf  # the converter's: its own gguf-py first (conversion.base puts it on sys.path), else PyPI's

    hf_dir, gguf_path = Path(hf_dir), Path(gguf_path)
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}[gguf_type]
    # Its per-tensor INFO lines, and warnings this module answers: the unrecognised pre-tokenizer (named here),
    # "Unknown RoPE type: default" (plain RoPE, which it writes as such); the check below sees the result.
    logging.getLogger("hf-to-gguf").setLevel(logging.ERROR)
    with torch.inference_mode():
        hparams = ModelBase.load_hparams(hf_dir, False)
        model_class = get_model_class(get_model_architecture(hparams, ModelType.TEXT))
        model = model_class(hf_dir, file_type, gguf_path)
        model.get_vocab_base_pre = _named_pre_tokenizer(model.get_vocab_base_pre, hf_dir)
        model.set_vocab = _with_special_token_flags(model.set_vocab, model.gguf_writer, hf_dir, gguf.Keys.Tokenizer)
        model.write()
    return gguf_path


def _scaling_kind(kind: str | None) -> str:
    from megatron_ext.positions.scaling import scaling_kind

    return scaling_kind(kind)


def export_gguf(checkpoint: str | Path, output: str | Path, *, gguf_type: str = "f32",
                llama_cpp: str | Path | None = None, check: bool = True, check_tokens: int | None = None,
                **hf_options: Any) -> dict:
    """Write DIR/hf and DIR/model-TYPE.gguf (checked unless check=False); returns what was written and measured."""
    from pretrain.hf.export import check_output, drope_dropped, export_checkpoint, publish
    from pretrain.hf.export_tokenizer import resolve_tokenizer_path
    from pretrain.trainer import checkpoint as ckpt
    from pretrain.trainer import config as config_module

    output = Path(output)
    if hf_options.get("no_tokenizer"):
        raise ValueError("export-gguf needs the tokenizer (a GGUF carries it): drop --no-tokenizer")
    check_output(output, bool(hf_options.get("overwrite")))
    record = ckpt.read_train_state(checkpoint)
    train_config = config_module.from_dict(record["config"])
    # what the export will be: a recalibrated DroPE checkpoint is a model without RoPE in any layer
    check_llama_cpp_runs(drope_dropped(train_config, record) or train_config.model,
                         _scaling_kind(hf_options.get("rope_scaling")))
    tokenizer = resolve_tokenizer_path(record, hf_options.get("tokenizer"))
    if tokenizer:
        check_tokenizer_runs(tokenizer)  # before the weights; the exported files are checked again below
    tree = converter_dir(llama_cpp)  # before the weights: a missing converter fails in a second
    if check:
        from pretrain.hf.gguf_check import require_llama_cpp

        require_llama_cpp()
    tmp = output.with_name(output.name + ".tmp-gguf")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        export_checkpoint(checkpoint, tmp / "hf", **{**hf_options, "overwrite": False})
        check_tokenizer_runs(tmp / "hf")
        gguf_path = convert_to_gguf(tmp / "hf", tmp / gguf_name(gguf_type), gguf_type, tree)
        result = {"gguf": output / gguf_name(gguf_type), "hf": output / "hf"}
        if check:
            from pretrain.hf.gguf_check import check_gguf

            result["check"] = check_gguf(tmp / "hf", gguf_path, train_config.model.seq_length, gguf_type,
                                         length=check_tokens)
        publish(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def export_gguf_cli(argv: list[str]) -> int:
    """`python -m pretrain export-gguf`: checkpoint -> HF export -> llama.cpp GGUF, checked against transformers."""
    from pretrain.hf.arguments import export_gguf_parser

    parser = export_gguf_parser()
    args = parser.parse_args(argv)
    if getattr(args, "checkpoint", None) is None:
        parser.error("the run to export is missing: python -m pretrain export-gguf RUN --output DIR")
    options = {k: getattr(args, k) for k in ("tokenizer", "no_tokenizer", "rope_scaling", "factor", "eval_length",
                                             "max_shard_size", "dtype", "overwrite", "max_position_embeddings")}
    try:
        result = export_gguf(args.checkpoint, args.output, gguf_type=args.gguf_type, llama_cpp=args.llama_cpp,
                             check=not args.no_check, check_tokens=args.check_tokens, **options)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError, ImportError) as error:
        print(f"export-gguf: error: {error}", file=sys.stderr)
        return 2
    check = result.get("check")
    said = (f"; llama.cpp = transformers within {check['tolerance']:g} (max |Δlogit| {check['max_abs_diff']:.2e} "
            f"at positions {', '.join(map(str, check['positions']))})" if check else "; not checked (--no-check)")
    print(f"wrote {result['gguf']} (and the Hugging Face export {result['hf']}){said}")
    return 0
