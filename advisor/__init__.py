"""transformer-advisor: profile a Transformer, pick the fastest config that fits, train it."""

__version__ = "0.1.0"
