"""data_prep: stream corpora into Megatron-Core `.bin/.idx` shards, resumably and in parallel."""

__version__ = "0.1.0"
