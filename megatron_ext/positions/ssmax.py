"""Scalable-Softmax (SSMax; Nakanishi, "Scalable-Softmax Is Superior for Attention", arXiv 2501.19399).

Rule: softmax over n keys becomes softmax of (s·log n)·z, i.e. every logit z of a query is multiplied by
s·log n, with n the number of keys the query sees (i + 1 for the token at index i under causal attention).
The paper learns s per head; here s is one fixed number per model (model.ssmax_scale), which keeps the
checkpoint layout unchanged. With s = 1 / log w the query at the end of the training window w attends as in
standard softmax; earlier queries are flatter and later (longer-context) ones sharper.
"""

from __future__ import annotations

import torch


def ssmax_factor(keys_seen: torch.Tensor, scale: float) -> torch.Tensor:
    """s·log n for n = keys_seen (float32; n = 1 gives 0: a lone key gets all the weight anyway)."""
    return scale * torch.log(keys_seen.to(torch.float32))
