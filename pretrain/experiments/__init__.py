"""Experiments: the sizes × methods table, shipped configs and launchers, reproduction, demo."""
