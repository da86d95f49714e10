"""The trainer: config, Megatron engine, data, process groups, checkpoints, the loop."""
