"""The command lines of `python -m pretrain export-hf`, `export-gguf` and `import-hf`, built without importing torch.

`python -m pretrain` parses with these before it imports the command's module, so `--help` and a wrong
invocation answer in well under a second; export_cli / import_cli then parse the same arguments again.
"""

from __future__ import annotations

import argparse

from pretrain.cli import Parser, add_set

# Copies of megatron_ext.positions.scaling's tables (that package imports torch);
# tests/test_cli_grammar.py keeps them equal to the originals.
ROPE_SCALING_KINDS = ("none", "pi", "ntk", "dynamic_ntk", "yarn", "llama3")
ROPE_SCALING_ALIASES = {"linear": "pi", "dynamic": "dynamic_ntk", "default": "none"}
EXPORT_DTYPES = ("float32", "bfloat16", "float16")


def cli_scaling_kind(name: str) -> str:
    """argparse `type` for --rope-scaling: our kind for an HF alias ('linear' -> 'pi'); others pass through."""
    return ROPE_SCALING_ALIASES.get(name or "none", name or "none")  # `choices` then names the valid kinds


def export_parser() -> Parser:
    """The parser of `python -m pretrain export-hf`."""
    parser = Parser(prog="python -m pretrain export-hf",
                    description="`python -m pretrain export-hf`: checkpoint (any TP/PP) -> Hugging Face Llama "
                                "(or Qwen2) directory.")
    return _add_export_arguments(parser, "export-hf")


def export_gguf_parser() -> Parser:
    """The parser of `python -m pretrain export-gguf`: export-hf's flags, the GGUF type, the converter, the check."""
    from pretrain.hf.gguf_support import GGUF_TYPES, LLAMA_CPP_DIR_ENV, logits_tolerance

    parser = Parser(prog="python -m pretrain export-gguf",
                    description="`python -m pretrain export-gguf`: checkpoint -> Hugging Face export (DIR/hf) -> "
                                "llama.cpp GGUF (DIR/model-TYPE.gguf) by llama.cpp's own converter, checked against "
                                "transformers inside and beyond the window (docs/hf.md: what converts).")
    _add_export_arguments(parser, "export-gguf")
    parser.add_argument("--gguf-type", choices=GGUF_TYPES, default="f32",
                        help="GGUF weight type (the check's largest logit difference to transformers: "
                        + ", ".join(f"{kind} {logits_tolerance(kind):g}" for kind in GGUF_TYPES) + ")")
    parser.add_argument("--llama-cpp", metavar="DIR", help="llama.cpp source tree with convert_hf_to_gguf.py "
                        f"(default: ${LLAMA_CPP_DIR_ENV})")
    parser.add_argument("--check-tokens", type=int, help="length of the llama.cpp vs transformers check "
                        "(default: 8 x the training window)")
    parser.add_argument("--no-check", action="store_true", help="skip that check (it needs llama-cpp-python)")
    return parser


def _add_export_arguments(parser: Parser, command: str) -> Parser:
    """export-hf's flags (export-gguf takes the same)."""
    # SUPPRESS: an absent positional must not overwrite what the deprecated --checkpoint stored
    parser.add_argument("checkpoint", nargs="?", default=argparse.SUPPRESS, metavar="RUN",
                        help="run directory (its latest) or an iter_* directory, as `eval run` and `runs` take it")
    if command == "export-hf":  # its former spelling; export-gguf never had one
        parser.add_deprecated("--checkpoint", "checkpoint", "the run as the first argument: export-hf RUN --output DIR")
    parser.add_argument("--output", required=True, help="directory to write (must be empty unless --overwrite)")
    parser.add_argument("--tokenizer", help="tokenizer.json, SentencePiece .model, vocab.json+merges.txt dir, or "
                        "an HF tokenizer dir (shipped unchanged; default: an imported model's files, else the "
                        "tokenizer of the run's data manifest)")
    parser.add_argument("--no-tokenizer", action="store_true", help="export the model without tokenizer files")
    parser.add_argument("--rope-scaling", type=cli_scaling_kind, choices=ROPE_SCALING_KINDS, default="none",
                        help="ship an inference-time RoPE scaling (e.g. PosAug + yarn; HF names linear/dynamic "
                        "accepted); RFS models get their own linear scaling")
    parser.add_argument("--factor", type=float, help="scaling factor (>= 1) for --rope-scaling")
    parser.add_argument("--eval-length", type=int, help="RFS: evaluation length n_eval the linear factor "
                        "max(n_train, n_eval) / L is computed for (default: training window × 8)")
    parser.add_argument("--max-position-embeddings", type=int, help="config.json's context length (default: "
                        "what the method serves, e.g. PosAug alpha_max x window; table in pretrain/hf/context.py)")
    parser.add_argument("--max-shard-size", default="2GB", help="shard model.safetensors above this size")
    parser.add_argument("--dtype", choices=EXPORT_DTYPES, default="float32")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    return parser


def import_parser() -> Parser:
    """The parser of `python -m pretrain import-hf`."""
    parser = Parser(prog="python -m pretrain import-hf",
                    description="`python -m pretrain import-hf`: Llama / Mistral / Qwen2 HF directory -> our "
                                "checkpoint (torchrun for TP×PP > 1).")
    parser.add_argument("--hf", required=True, help="Hugging Face model directory (config.json + safetensors)")
    parser.add_argument("--output", required=True, help="run directory to write the iteration-0 checkpoint to")
    parser.add_argument("--tp", "--tensor-model-parallel-size", dest="tensor_model_parallel_size", type=int,
                        default=1, help="tensor-parallel size of the written checkpoint")
    parser.add_argument("--pp", "--pipeline-model-parallel-size", dest="pipeline_model_parallel_size", type=int,
                        default=1, help="pipeline-parallel size of the written checkpoint")
    parser.add_argument("--seq-length", type=int, help="training window (default: max_position_embeddings)")
    add_set(parser, dest="overrides", help="config override recorded with the checkpoint")
    parser.add_argument("--seed", type=int, default=1234, help="seed recorded in the run's config")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a non-empty output (only once the new checkpoint is complete)")
    return parser
