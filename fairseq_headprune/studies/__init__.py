"""One module per study: typed functions with an options dataclass that take a loaded model, never argv."""
