"""The `ferry` command's client side: argument parsing and output only (the SDK does the work)."""
