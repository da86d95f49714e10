"""Load exported HF directories with whatever transformers is importable and save their logits.

Run in a separate interpreter, e.g. with a transformers 4.x site-packages first on PYTHONPATH:
`python tests/distributed/hf_load_logits.py --tokens t.pt --out logits.pt DIR...`. Prints
'RESULT {"version": ..., "warnings": {DIR: [...]}}'.
"""

import argparse
import json
import logging
import warnings

import torch
import transformers


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("dirs", nargs="+")
    args = parser.parse_args()
    tokens = torch.load(args.tokens)
    logits, messages = {}, {}
    for directory in args.dirs:
        handler = _Records()
        logging.getLogger("transformers").addHandler(handler)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="sdpa")
        logging.getLogger("transformers").removeHandler(handler)
        with torch.no_grad():
            logits[directory] = model.float().eval()(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits
        messages[directory] = handler.messages + [str(w.message) for w in caught
                                                  if not issubclass(w.category, (DeprecationWarning, FutureWarning))]
    torch.save(logits, args.out)
    print("RESULT " + json.dumps({"version": transformers.__version__, "warnings": messages}), flush=True)


if __name__ == "__main__":
    main()
