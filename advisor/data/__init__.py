"""advisor/data."""
