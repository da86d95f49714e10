"""Helpers shared by the tests/hf files: Megatron and HF logits, tiny HF Llama dirs, warning capture."""

import contextlib
import json
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


def read_config(path):
    """config.json of an HF directory as a dict."""
    return json.loads((path / "config.json").read_text())


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


# Small random models of each architecture import-hf supports, as transformers builds them.
ARCH_COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-6)
ARCH_VOCAB = ARCH_COMMON["vocab_size"]
# Llama 3.1's scaling shrunk to the test model: with head_dim 16 and base 10000 the wavelengths
# 6.3 (< 32 / 4: kept), 19.9 (interpolated) and 62.8+ (> 32: divided by 4) cover all three bands.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
ARCHITECTURES = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False, rope_parameters={"rope_type": "default",
                                                                              "rope_theta": 10000.0})),
    "llama3": ("LlamaConfig", dict(tie_word_embeddings=False, rope_parameters=LLAMA3_ROPE)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                                             "rope_theta": 1000000.0})),
    "mistral": ("MistralConfig", dict(tie_word_embeddings=False, sliding_window=None,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
}


def randomize_every_parameter(model, seed=0):
    """Every parameter drawn non-zero: weights N(0, 0.05), biases N(0, 0.5), norm weights 1 + N(0, 0.2)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith(".bias"):
                parameter.copy_(noise * 0.5)
            elif "norm" in name:
                parameter.copy_(1 + noise * 0.2)
            else:
                parameter.copy_(noise * 0.05)
    return model


def save_random_hf(path, arch: str):
    """ARCHITECTURES[arch] built and saved by transformers (safetensors), every parameter non-zero."""
    import transformers
    from transformers import AutoModelForCausalLM

    config_class, fields = ARCHITECTURES[arch]
    config = getattr(transformers, config_class)(**ARCH_COMMON, **fields)
    model = AutoModelForCausalLM.from_config(config)
    randomize_every_parameter(model).save_pretrained(path)
    return path
