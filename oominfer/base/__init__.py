"""What every step shares and that imports nothing of oominfer: the errors and their exit
codes, byte and token units, the version."""
