"""Helpers shared by the tests/hf files: Megatron and HF logits, tiny HF Llama dirs, warning capture."""

import contextlib
import logging
import shutil
import warnings

import torch

from megatron_ext.model import ParallelConfig, build_model
from pretrain.hf.export import load_checkpoint_state

VOCAB = 512


def megatron_model(checkpoint):
    """(eval-mode FloatPositionGPTModel at TP=PP=1, TrainConfig) of a saved checkpoint."""
    state, config, _ = load_checkpoint_state(checkpoint)
    model = build_model(config.model, ParallelConfig())
    model.load_state_dict(state, strict=False)
    return model.eval(), config


def megatron_logits(model, tokens, positions):
    """Megatron logits over the tokenizer's vocabulary (padding rows dropped)."""
    with torch.no_grad():
        return model(tokens, positions, None)[..., :VOCAB]


def auto_model(path):
    """float32 sdpa AutoModelForCausalLM from an exported directory."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()


def sample_tokens(seq, seed=0, batch=2):
    """Random token ids below 500 (inside every test tokenizer's vocabulary)."""
    return torch.randint(0, 500, (batch, seq), generator=torch.Generator().manual_seed(seed))


def save_hf_llama(path, spm_model: str):
    """A random GQA Llama saved by transformers itself, with SentencePiece-style tokenizer files
    (tokenizer.json, tokenizer_config.json, tokenizer.model; <unk>=0, <s>=1, </s>=2) like Llama 2's."""
    from data_prep.tokenizers import load_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from pretrain.hf.tokenizer import hf_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(path)
    hf_tokenizer(load_tokenizer(spm_model)).save_pretrained(path)
    shutil.copyfile(spm_model, path / "tokenizer.model")
    return path


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def transformers_warnings():
    """Collect every transformers logging warning and Python warning raised inside the block."""
    handler, logger = _Records(), logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield handler.messages
    finally:
        logger.removeHandler(handler)
    handler.messages.extend(str(w.message) for w in caught)
