"""vlmdata."""
