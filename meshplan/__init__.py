"""meshplan: plan, predict and run parallel layouts for transformer and Mamba models."""

__version__ = "0.1.0"
