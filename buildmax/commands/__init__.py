"""The kernel's commands, grouped by what they manage."""
