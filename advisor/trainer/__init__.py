"""advisor/trainer."""
