"""`import-hf` under torchrun (e.g. TP=2): every rank writes its shard of the checkpoint."""

import json
import sys

import torch.distributed as dist  # noqa: F401  (torchrun sets the env import_hf reads)

from pretrain.hf.importer import import_cli

if __name__ == "__main__":
    code = import_cli(sys.argv[1:])
    print("RESULT " + json.dumps({"code": code}), flush=True)
    sys.exit(code)
