"""Backups and restores of a deployment: its database and its blobs as one
pair (``buildmax backup create|verify|restore``)."""
