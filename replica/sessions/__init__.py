"""Sessions of one replica: what each holds between turns, and every path that frees it."""
