"""Documents in and out: plan.json (the one plan document, read and checked whole) and the
reports (tables, deterministic JSON, CSV, output sets written whole)."""
