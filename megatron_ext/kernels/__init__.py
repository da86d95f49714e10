"""Triton kernels, one per module, each with its layout contract and a torch reference at the top of its file.

Kernels are jitted on first use, not at import: Triton reads TRITON_INTERPRET when a function is jitted, so a
process that sets it before its first launch (the CPU tests) gets the interpreter whatever imported this package
first.
"""
