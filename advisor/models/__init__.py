"""advisor/models."""
