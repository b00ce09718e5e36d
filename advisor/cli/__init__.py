"""advisor/cli."""
