"""Foundations every layer may import: errors and exit codes, bounds on input, defaults named
once, bounded reading of user files, and how independent work units run (serially or in
processes, or on Ray)."""
