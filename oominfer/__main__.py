"""``python -m oominfer``."""

from oominfer.cli import main

main()
