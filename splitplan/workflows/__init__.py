"""What the library does with plans, over the pure layers: simulating and validating plans,
design studies (compare, sweep, windows) and calibrating engine profiles."""
