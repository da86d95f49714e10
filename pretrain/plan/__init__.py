"""`pretrain plan`: memory per GPU, FLOPs, step time and GPU-hours of a run, before it starts.

params.py (exact parameters and state bytes from Megatron's shapes), activations.py (the activation
formulas and their source), hardware.py (GPUs, published MFU), estimate.py (the plan), report.py
(rendering), layout.py (config + GPUs -> a validated layout and its plan), sweep.py (the table.py
grid), measure.py (what a real CPU step allocates), cli.py.
"""
