"""``python -m buildmax`` runs the command line."""

from .cli import main

main()
